"""The one table of pending reasons (transforms/pending.py): every reason the job's steps can give
a row is in it, and the exit code, the terminal's advice and the library's words come from it.
No HTTP, no Beam pipeline."""
from __future__ import annotations

import ast
import importlib
import inspect

import pytest

from pipeline.terminal.summary import advice
from transforms import pending
from transforms.pending import (BALANCE, BUDGET, PREFLIGHT, REASONS, STORE_CHANGED, TIMED_OUT,
                                UNAUTHORIZED, exit_code)

# The modules that give rows a pending reason: the sender, the Embed step, the library's claims.
PRODUCERS = ("transforms.embed.send", "transforms.embed.transform", "transforms.dedupe.inflight")


def _reason_expressions(tree: ast.AST):
    """What a pending row's reason is made of: the second of each (item, reason) pair put in a
    `pending` list (or a `lost` one), the reason a breaker trips or a guard stops with."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("trip", "stop"):
            yield node.args[0]
        values = []
        if isinstance(node, ast.AugAssign) and getattr(node.target, "attr", None) == "pending":
            values.append(node.value)
        if isinstance(node, ast.keyword) and node.arg == "pending":
            values.append(node.value)
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "lost" for t in node.targets):
            values.append(node.value)
        for value in values:
            for pair in ast.walk(value):
                if isinstance(pair, ast.Tuple) and isinstance(pair.ctx, ast.Load) and len(pair.elts) == 2:
                    yield pair.elts[1]


def _names(expression: ast.AST, tree: ast.AST):
    """The expressions a reason may evaluate to: each operand of `a or b`, each branch of
    `a if c else b`, and what a local name is assigned."""
    if isinstance(expression, ast.BoolOp):
        for operand in expression.values:
            yield from _names(operand, tree)
    elif isinstance(expression, ast.IfExp):
        yield from _names(expression.body, tree)
        yield from _names(expression.orelse, tree)
    elif isinstance(expression, ast.Name) and expression.id.islower():
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == expression.id for t in node.targets):
                yield from _names(node.value, tree)
    else:
        yield expression


def _given(module_name: str) -> set[str]:
    """The reasons MODULE_NAME gives pending rows, each checked to be a name the table defines."""
    module = importlib.import_module(module_name)
    tree = ast.parse(inspect.getsource(module))
    given = set()
    for expression in _reason_expressions(tree):
        for part in _names(expression, tree):
            if isinstance(part, ast.Attribute) and part.attr in ("reason", "stop_reason"):
                continue   # what a breaker tripped or a guard stopped with: a reason given elsewhere
            assert isinstance(part, ast.Name), f"{module_name}: a reason written as {ast.unparse(part)}"
            value = getattr(module, part.id)
            assert value in REASONS, f"{module_name}: {part.id} = {value!r} is not in the table"
            given.add(value)
    return given


@pytest.mark.parametrize("module_name", PRODUCERS)
def test_every_reason_a_step_gives_a_pending_row_is_in_the_table(module_name):
    """A reason written in place, or one the table lacks, would be missed by the exit code, the
    terminal and the library (as the library's own list missed `timed_out`)."""
    assert _given(module_name) <= set(REASONS)


def test_the_table_holds_the_reasons_the_steps_give_and_no_other():
    assert set().union(*map(_given, PRODUCERS)) == set(REASONS)


def test_the_exit_code_of_a_run_is_its_worst_reason():
    assert exit_code({}) == 0
    assert exit_code({BUDGET: 3, BALANCE: 1}) == 4
    assert exit_code({BUDGET: 3, PREFLIGHT: 2}) == 3
    assert exit_code({BUDGET: 3, TIMED_OUT: 1, PREFLIGHT: 2}) == 1
    assert exit_code({STORE_CHANGED: 1}) == 4
    assert exit_code({"a_reason_nobody_named": 1}) == 1   # rows unsent for it: never 0


def test_the_terminal_takes_a_reasons_own_advice_from_the_table():
    report = {"exit_code": 1, "pending_reasons": {TIMED_OUT: 5}, "caps": {}, "timed_out_attempts": 2}
    said = advice(report, "out", "the same command")
    assert "raise it in a YAML file holding `client: {read_timeout_max_s: SECONDS}`" in said
    assert "fix the cause" not in said and "2 attempts timed out" in said
    report["pending_reasons"] = {UNAUTHORIZED: 5}
    assert "fix the cause and run the same command" in advice(report, "out", "the same command")


def test_no_reason_calls_a_text_that_may_have_been_sent_not_sent():
    for reason in (TIMED_OUT, BUDGET):   # a timed-out attempt's retry may not fit the budget
        assert not REASONS[reason].words.startswith("not sent")
    assert pending.detail(TIMED_OUT, "the breaker's message").endswith("(the breaker's message)")
    assert pending.detail("who_knows") == "not embedded: who_knows"
