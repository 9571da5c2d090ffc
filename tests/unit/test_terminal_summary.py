"""`run`'s short summary as a pure function: summary.json's dict in, a few lines out, one per
exit code a run can end with after the job (0, 1, 3, 4)."""
from __future__ import annotations

import copy
import logging

from pipeline.terminal import summary
from pipeline.terminal.figures import count, exact, rub
from tests.e2e.money_helpers import balances

FIRST_RUN = {
    "run_id": "20261124T090528Z-d9d3a8", "model": "text-embedding-3-small", "documents": 354,
    "embedded": 354, "failed": 0, "pending": 0, "failed_reasons": {}, "pending_reasons": {},
    "requests": 1, "prompt_tokens": 98166, "cost_rub": 0.245415,
    "changes": {"added": 354, "edited": 0, "removed": 0, "unchanged": 0, "resumed": 0},
    "current": {"view": "20261124T090528Z-d9d3a8", "documents": 354, "chunks": 354, "embedded": 354,
                "failed": 0, "pending": 0, "staged": 0},
    "caps": {"daily_cap_rub": None, "monthly_cap_rub": None, "binding_limit": "balance"},
    "reconciliation": {"runs": ["20261124T090528Z-d9d3a8"], "rows_cost_rub": 0.245415,
                       "balance_delta_rub": 0.245415, "lost": {"count": 0, "rub": 0.0}, "others_rub": 0.0,
                       "unexplained_rub": 0.0, "notes": []},
    "exit_code": 0,
}
AGAIN = "the same command again with --resume"


def report(**changes) -> dict:
    doc = copy.deepcopy(FIRST_RUN)
    for key, value in changes.items():
        doc[key] = {**doc[key], **value} if isinstance(doc.get(key), dict) else value
    return doc


def rendered(doc: dict, output: str = "out") -> list[str]:
    return summary.lines(doc, output, summary.advice(doc, output, AGAIN))


def row(lines: list[str], label: str) -> str:
    found = [line for line in lines if line.split()[0] == label]
    assert len(found) == 1, lines
    return found[0]


def test_exit_0_says_what_was_embedded_what_it_cost_and_where_the_files_are():
    lines = rendered(FIRST_RUN)
    assert lines[0] == "run 20261124T090528Z-d9d3a8 (text-embedding-3-small): done (exit 0)"
    assert row(lines, "read").split(None, 1)[1] == "354 documents"   # a first run: no change counts
    assert "354 chunks embedded, 0 failed, 0 pending" in row(lines, "this")
    assert "354 documents, 354 chunks: 354 embedded, 0 failed, 0 pending" in row(lines, "view")
    money = row(lines, "money")
    assert "0.245415 RUB for 1 request (98,166 tokens)" in money
    assert money.endswith("balance −0.245415 = rows 0.245415 RUB")   # the parts that are 0 left out
    assert row(lines, "files").split(None, 1)[1] == "out/current/ (the view), out/summary.json"
    assert summary.advice(FIRST_RUN, "out", AGAIN) is None and not any(line.split()[0] == "next" for line in lines)
    assert len(lines) <= 10


def test_a_sync_run_shows_the_changes_with_thousands_separators():
    doc = report(documents=12_345, changes={"added": 3, "edited": 2, "removed": 1, "unchanged": 12_340},
                 current={"documents": 12_344, "chunks": 20_001, "embedded": 20_001, "staged": 4})
    lines = rendered(doc)
    assert row(lines, "read").endswith("12,345 documents: 3 added, 2 edited, 1 removed, 12,340 unchanged")
    assert row(lines, "view").endswith("12,344 documents, 20,001 chunks: 20,001 embedded, 0 failed, 0 pending, "
                                       "4 staged")


def test_rows_whose_vectors_were_paid_before_are_not_called_embedded():
    """A --sync that only gave rows their text, or reused known texts, sent nothing: its rows
    are reused, as summary.json counts them, not embedded."""
    lines = rendered(report(embedded=98, reused=98, requests=0))
    assert "0 chunks embedded, 98 reused (paid before), 0 failed, 0 pending" in row(lines, "this")
    lines = rendered(report(embedded=100, reused=40))
    assert "60 chunks embedded, 40 reused (paid before), 0 failed" in row(lines, "this")


def test_exit_1_names_the_cause_and_the_command_that_continues():
    doc = report(exit_code=1, embedded=100, pending=254, pending_reasons={"unauthorized": 254})
    lines = rendered(doc)
    assert lines[0].endswith("stopped early: unauthorized (exit 1)")
    assert "100 chunks embedded, 0 failed, 254 pending (unauthorized)" in row(lines, "this")
    assert row(lines, "next").split(None, 1)[1] == (
        "stopped early: unauthorized. The unsent chunks are pending in out (summary.json lists the files); "
        "fix the cause and run the same command again with --resume: nothing is paid twice.")


def test_exit_1_after_timeouts_names_the_setting_and_never_says_nothing_is_paid_twice():
    doc = report(exit_code=1, embedded=0, pending=50, pending_reasons={"timed_out": 50}, timed_out_attempts=6)
    lines = rendered(doc)
    assert "6 attempts timed out (may be billed)" in row(lines, "money")
    advice = row(lines, "next").split(None, 1)[1]
    assert advice == (
        "stopped early: timed_out. The unsent chunks are pending in out (summary.json lists the files); the "
        "service answered slower than client.read_timeout_max_s: raise it in a YAML file holding "
        "`client: {read_timeout_max_s: SECONDS}` (or in the --run-config file you pass) and run the same command "
        "again with --resume adding --run-config FILE: 6 attempts timed out after sending and may have been billed "
        "(timed_out_attempts in summary.json); nothing answered is paid again.")
    other = rendered(report(exit_code=1, pending=5, pending_reasons={"service_unavailable": 5}, timed_out_attempts=1))
    assert "nothing is paid twice" not in row(other, "next") and "1 attempt timed out after sending" in row(other, "next")


def test_exit_3_says_nothing_was_sent_and_which_limit_binds():
    doc = report(exit_code=3, embedded=0, pending=354, pending_reasons={"estimate_exceeds_budget": 354},
                 requests=0, prompt_tokens=0, cost_rub=0.0, caps={"binding_limit": "max_spend_rub"},
                 reconciliation={"rows_cost_rub": 0.0, "balance_delta_rub": 0.0})
    lines = rendered(doc)
    assert lines[0].endswith("nothing sent, the estimate does not fit (exit 3)")
    assert row(lines, "money").endswith("0 RUB for 0 requests (0 tokens) · the balance did not change")
    assert "(max_spend_rub binds): nothing was sent" in row(lines, "next")
    assert "--allow-partial" in row(lines, "next")


def test_exit_4_points_at_the_pending_rows_and_the_whole_reconciliation():
    doc = report(exit_code=4, embedded=265, failed=1, pending=52, failed_reasons={"empty_text": 1},
                 pending_reasons={"budget_exhausted": 50, "insufficient_balance": 2}, requests=1_234,
                 prompt_tokens=1_234_567, cost_rub=1234.567891,
                 reconciliation={"runs": ["a", "b"], "rows_cost_rub": 1.2, "balance_delta_rub": 1.3,
                                 "lost": {"rub": 0.05}, "others_rub": 0.05, "notes": ["..."]})
    lines = rendered(doc, "gs://bucket/out")
    assert lines[0].endswith("stopped, the budget ran out (exit 4)")
    assert row(lines, "this").endswith("265 chunks embedded, 1 failed (empty_text), 52 pending "
                                       "(budget_exhausted 50, insufficient_balance 2)")
    assert row(lines, "money").split(None, 1)[1] == (
        "1,234.57 RUB for 1,234 requests (1,234,567 tokens) · "
        "balance −1.3 = rows 1.2 + lost 0.05 + others 0.05 RUB over 2 runs (notes in summary.json)")
    assert row(lines, "files").split(None, 1)[1] == "gs://bucket/out/summary.json (its `files` are the view)"
    assert "the rest is pending in gs://bucket/out" in row(lines, "next")
    assert f"run {AGAIN} when there is more budget" in row(lines, "next")


def test_every_part_of_the_reconciliation_that_is_not_0_is_in_the_line_and_it_balances():
    after_search = report(reconciliation={"runs": list("abcde"), "rows_cost_rub": 1.94412, "balance_delta_rub": 1.94414,
                                          "searches": {"count": 1, "rub": 0.00002}})
    money = row(rendered(after_search), "money")
    assert money.endswith("balance −1.94414 = rows 1.94412 + searches 0.00002 RUB over 5 runs")
    assert balances(money)
    every = report(reconciliation={"rows_cost_rub": 1.2, "balance_delta_rub": 1.300021, "searches": {"rub": 0.000021},
                                   "lost": {"rub": 0.05}, "others_rub": 0.07, "unexplained_rub": -0.02})
    money = row(rendered(every), "money")
    assert money.endswith("= rows 1.2 + searches 0.000021 + lost 0.05 + others 0.07 − unexplained 0.02 RUB")
    assert balances(money)
    topped_up = report(reconciliation={"rows_cost_rub": 2.0, "balance_delta_rub": -3.0, "unexplained_rub": -5.0})
    assert row(rendered(topped_up), "money").endswith("balance +3 = rows 2 − unexplained 5 RUB")
    assert balances(row(rendered(topped_up), "money"))


def test_a_balance_not_read_after_the_run_is_said_not_guessed():
    doc = report(reconciliation={"balance_delta_rub": None})
    assert row(rendered(doc), "money").endswith("the balance was not read at both ends: see the notes in summary.json")


def test_roubles_to_the_micro_rouble_below_100_and_to_the_kopeck_above():
    assert [rub(v) for v in (0.245415, 0.0, 1.5, 99.754585, 100.0, 1234.5678, None)] == [
        "0.245415", "0", "1.5", "99.754585", "100.00", "1,234.57", "?"]
    assert [exact(v) for v in (1234.5, -0.0000001, 0.000001)] == ["1,234.5", "0", "0.000001"]
    assert [count(n, "request") for n in (0, 1, 1234)] == ["0 requests", "1 request", "1,234 requests"]


SWITCHING = {"from": {"model": "text-embedding-3-small", "dimensions": 1536},
             "to": {"model": "text-embedding-3-large", "dimensions": 3072}, "runs": ["r1", "r2"],
             "documents_done": 1212, "documents_total": 3000, "spent_rub": 0.81, "estimated_rub_to_finish": 1.2,
             "switched": False, "abandoned": None,
             "run": {"cost_rub": 0.4, "requests": 3, "prompt_tokens": 25000, "exit_code": 4}}


def test_a_switch_under_way_is_one_line_and_its_money_beside_the_served_view_s():
    lines = rendered(report(exit_code=4, switch=SWITCHING))
    assert row(lines, "switch").split(None, 1)[1] == (
        "text-embedding-3-small -> text-embedding-3-large: 1,212 of 3,000 documents, 0.81 RUB in 2 runs, "
        "0.4 this run, ~1.2 RUB to finish · its view: target/")
    assert "0.245415 RUB for 1 request (98,166 tokens) + 0.4 RUB for text-embedding-3-large (3 requests, " \
           "25,000 tokens)" in row(lines, "money")
    advice = row(lines, "next")
    assert "switch to text-embedding-3-large is not complete (1,212 of 3,000 documents)" in advice
    assert "out/current/ keeps serving text-embedding-3-small" in advice and AGAIN in advice
    assert lines[0] == ("run 20261124T090528Z-d9d3a8 (text-embedding-3-small, switching to text-embedding-3-large): "
                        "stopped, the budget ran out (exit 4)")


def test_the_advice_is_logged_as_what_the_stop_is():
    assert summary.advice_level(report(exit_code=4, switch=SWITCHING)) == logging.INFO   # how a switch goes
    assert summary.advice_level(report(exit_code=4, switch=SWITCHING, pending=3)) == logging.WARNING
    assert summary.advice_level(report(exit_code=4, pending=52, pending_reasons={"budget_exhausted": 52})) \
        == logging.WARNING
    assert summary.advice_level(report(exit_code=3, pending=52)) == logging.WARNING   # nothing sent, as designed
    assert summary.advice_level(report(exit_code=1, pending=5, pending_reasons={"unauthorized": 5})) == logging.ERROR


def test_the_run_that_switches_and_one_that_abandons_a_switch_say_so():
    done = {**SWITCHING, "switched": True, "documents_done": 3000}
    lines = rendered(report(switch=done))
    assert row(lines, "switch").endswith("switched, current/ serves text-embedding-3-large (0.81 RUB in 2 runs)")
    assert lines[0] == ("run 20261124T090528Z-d9d3a8 (text-embedding-3-large, switched from text-embedding-3-small): "
                        "done (exit 0)")   # the model the view serves now
    gone = {"abandoned": {"to": {"model": "text-embedding-ada-002", "dimensions": 1536}, "runs": ["r0"],
                          "spent_rub": 0.05}}
    line = row(rendered(report(switch={**done, **gone})), "switch")
    assert line.split(None, 1)[1].startswith("the switch to text-embedding-ada-002 was abandoned (0.05 RUB spent")
    assert row(rendered(report(switch=gone)), "switch").endswith("its vectors stay in history/)")
