"""The one table of pending reasons (transforms/pending.py): every reason the job's steps can give
a row is in it, and the exit code, the terminal's advice and the library's words come from it.
No HTTP, no Beam pipeline."""
from __future__ import annotations

import typing

from pipeline.terminal.summary import advice
from transforms import pending
from transforms.dedupe.inflight import stored_outcome
from transforms.embed.send import Breaker, Outcome
from transforms.money.budget import BudgetGuard
from transforms.pending import _PRECEDENCE, REASONS, Pending, exit_code
from transforms.records import TextItem


def test_every_way_a_step_gives_a_row_a_pending_reason_takes_a_member_of_the_table():
    """The sender's outcomes, its breaker, the budget guard's stop and the store's lost texts:
    what is given there is a Pending (make lint's mypy checks every call), so a reason written in
    place, or one the table lacks, cannot reach the exit code, the terminal or the library."""
    given = list[tuple[TextItem, Pending]]
    assert typing.get_type_hints(Outcome)["pending"] == given
    assert typing.get_type_hints(stored_outcome)["return"].__args__[3] == given
    assert typing.get_type_hints(Breaker.trip)["reason"] is Pending
    assert typing.get_type_hints(BudgetGuard.stop)["reason"] is Pending


def test_each_reason_of_the_table_is_whole():
    assert set(REASONS) == {r.value for r in Pending} and all(REASONS[r] is Pending(r) for r in REASONS)
    for reason in Pending:
        assert reason.exit_code in _PRECEDENCE and reason.words.startswith(("not sent", "not embedded")), reason
        assert reason.advice is None or "{again}" in reason.advice


def test_the_exit_code_of_a_run_is_its_worst_reason():
    assert exit_code({}) == 0
    assert exit_code({Pending.BUDGET: 3, Pending.BALANCE: 1}) == 4
    assert exit_code({Pending.BUDGET: 3, Pending.PREFLIGHT: 2}) == 3
    assert exit_code({Pending.BUDGET: 3, Pending.TIMED_OUT: 1, Pending.PREFLIGHT: 2}) == 1
    assert exit_code({Pending.STORE_CHANGED: 1}) == 4
    assert exit_code({"a_reason_nobody_named": 1}) == 1   # rows unsent for it: never 0


def test_the_terminal_takes_a_reasons_own_advice_from_the_table():
    report = {"exit_code": 1, "pending_reasons": {Pending.TIMED_OUT: 5}, "caps": {}, "timed_out_attempts": 2}
    said = advice(report, "out", "the same command")
    assert "raise it in a YAML file holding `client: {read_timeout_max_s: SECONDS}`" in said
    assert "fix the cause" not in said and "2 attempts timed out" in said
    report["pending_reasons"] = {Pending.UNAUTHORIZED: 5}
    assert "fix the cause and run the same command" in advice(report, "out", "the same command")


def test_no_reason_calls_a_text_that_may_have_been_sent_not_sent():
    for reason in (Pending.TIMED_OUT, Pending.BUDGET):   # a timed-out attempt's retry may not fit the budget
        assert not REASONS[reason].words.startswith("not sent")
    assert pending.detail(Pending.TIMED_OUT, "the breaker's message").endswith("(the breaker's message)")
    assert pending.detail("who_knows") == "not embedded: who_knows"


def test_each_reason_has_one_name():
    """Pending.X, never a module alias beside it: one name to grep for, one to import."""
    assert [name for name, value in vars(pending).items() if isinstance(value, Pending)] == []
