"""`run`'s short summary: what a person reads after a run, in a few lines (`run --json` prints
the whole of summary.json instead), and what to do next when the exit code is not 0."""
from __future__ import annotations

import logging
from typing import Any

from pipeline.exits import EXIT_DOES_NOT_FIT, EXIT_FAILED, EXIT_OK, EXIT_PARTIAL
from pipeline.outdir.view import is_local
from pipeline.terminal.figures import count, exact, rub
from transforms.pending import REASONS

ADVICE = {
    EXIT_FAILED: "stopped early: {why}. The unsent chunks are pending in {output} (summary.json lists "
                 "the files); fix the cause and run {again}: {paid}.",
    EXIT_DOES_NOT_FIT: "the estimate does not fit the spendable amount ({binding} binds): nothing "
                       "was sent. Raise that limit or the balance, or pass --allow-partial.",
    EXIT_PARTIAL: "the budget ran out: the rest is pending in {output} (summary.json lists the files); run "
                  "{again} when there is more budget (under --daily-cap-rub: on the service's next day).",
}
NOT_TWICE = "nothing is paid twice"
MAYBE_BILLED = ("{n} timed out after sending and may have been billed (timed_out_attempts in summary.json); "
                "nothing answered is paid again")
STATUS = {EXIT_OK: "done", EXIT_FAILED: "stopped early", EXIT_DOES_NOT_FIT: "nothing sent, the estimate does not fit",
          EXIT_PARTIAL: "stopped, the budget ran out"}


SWITCH_PARTIAL = ("the switch to {to} is not complete ({done:,} of {total:,} documents): {output}/current/ keeps "
                  "serving {from_} and {output}/target/ holds {to} as far as it goes; run {again} when there is "
                  "more budget (under --daily-cap-rub: on the service's next day).")


def advice_level(report: dict[str, Any]) -> int:
    """How the advice is logged: a run that failed is an error; one the budget stopped (or the
    preflight, sending nothing) ended as designed, with work left: a warning; a switch that is
    not complete yet, while the served view is whole, is how a switch goes: info."""
    code, switch = report["exit_code"], report.get("switch") or {}
    if code == EXIT_FAILED:
        return logging.ERROR
    if code == EXIT_PARTIAL and switch.get("to") and not switch.get("switched") and not report["pending"]:
        return logging.INFO
    return logging.WARNING


def switch_names(switch: dict[str, Any]) -> tuple[str, str]:
    """(from, to) of a switch as a reader tells them apart: the models, with their chunks in a
    switch to other chunks of the same model (between models, the names tell them apart)."""
    chunks = switch["from"]["model"] == switch["to"]["model"]

    def name(side: dict[str, Any]) -> str:
        return f"{side['model']} ({side['chunk_tokens']:,}-token chunks)" if chunks and side.get("chunk_tokens") \
            else side["model"]
    return name(switch["from"]), name(switch["to"])


def advice(report: dict[str, Any], output: str, again: str) -> str | None:
    """What to do next, for an exit code other than 0; None for 0."""
    switch = report.get("switch") or {}
    if report["exit_code"] == EXIT_PARTIAL and switch.get("to") and not switch.get("switched"):
        from_, to = switch_names(switch)
        return SWITCH_PARTIAL.format(to=to, from_=from_, again=again,
                                     done=switch["documents_done"], total=switch["documents_total"],
                                     output=output.rstrip("/"))
    message = ADVICE.get(report["exit_code"])
    cause = next((REASONS[r].advice for r in report["pending_reasons"] if r in REASONS and REASONS[r].advice), None)
    if message and cause:   # what the reason's own advice says to do, instead of "fix the cause"
        message = message.replace("fix the cause and run {again}", cause)
    timed_out = report.get("timed_out_attempts") or 0
    paid = MAYBE_BILLED.format(n=count(timed_out, "attempt")) if timed_out else NOT_TWICE
    return message and message.format(why=", ".join(report["pending_reasons"]) or "see summary.json",
                                      binding=report["caps"].get("binding_limit"), output=output, again=again,
                                      paid=paid)


def lines(report: dict[str, Any], output: str, next_step: str | None = None) -> list[str]:
    code, changes, view = report["exit_code"], report["changes"], report["current"]
    status = STATUS.get(code, "finished")
    if code == EXIT_FAILED and report["pending_reasons"]:
        status += ": " + ", ".join(report["pending_reasons"])
    read = f"{report['documents']:,} documents"
    if any(changes.get(c) for c in ("edited", "removed", "unchanged", "resumed")):   # not a first run
        read += ": " + ", ".join(f"{changes[c]:,} {c}" for c in ("added", "edited", "removed", "unchanged"))
        read += f", {changes['resumed']:,} resumed" if changes.get("resumed") else ""
    staged = f", {view['staged']:,} staged" if view.get("staged") else ""
    rows = [f"run {report['run_id']} ({_serves(report)}): {status} (exit {code})",
            _row("read", read),
            _row("this run", f"{_embedded(report)}, {report['failed']:,} failed"
                             f"{_why(report['failed_reasons'])}, {report['pending']:,} pending"
                             f"{_why(report['pending_reasons'])}"),
            _row("view", f"{view['documents']:,} documents, {view['chunks']:,} chunks: {view['embedded']:,} "
                         f"embedded, {view['failed']:,} failed, {view['pending']:,} pending{staged}"),
            _row("money", f"{rub(report['cost_rub'])} RUB for {count(report['requests'], 'request')} "
                          f"({report['prompt_tokens']:,} tokens){_target_money(report.get('switch'))}"
                          f"{_timed_out(report)} · {_reconciliation(report['reconciliation'])}"),
            _row("files", _files(output))]
    if report.get("switch"):
        rows.insert(4, _row("switch", _switch(report["switch"])))
    return rows + ([_row("next", next_step)] if next_step else [])


def _embedded(report: dict[str, Any]) -> str:
    """Rows this run's requests embedded, and those whose vectors earlier runs paid for (reused:
    known texts, or rows written again for their text)."""
    reused = report.get("reused") or 0
    line = f"{report['embedded'] - reused:,} chunks embedded"
    return line + f", {reused:,} reused (paid before)" if reused else line


def _serves(report: dict[str, Any]) -> str:
    """The model current/ serves after the run, and the one DIR is switching to, if any."""
    switch = report.get("switch") or {}
    if not switch.get("to"):
        return str(report["model"])
    from_, to = switch_names(switch)
    return f"{to}, switched from {from_}" if switch.get("switched") else f"{from_}, switching to {to}"


def _target_money(switch: dict[str, Any] | None) -> str:
    """What the run spent on a switch's target, beside the served view's share."""
    if not switch or not switch.get("run"):
        return ""
    run = switch["run"]
    return (f" + {rub(run['cost_rub'])} RUB for {switch['to']['model']} ({count(run['requests'], 'request')}, "
            f"{run['prompt_tokens']:,} tokens)")


def _timed_out(report: dict[str, Any]) -> str:
    n = report.get("timed_out_attempts") or 0
    return f", {count(n, 'attempt')} timed out (may be billed)" if n else ""


def _switch(switch: dict[str, Any]) -> str:
    """Where a switch of DIR to another model stands, in one line."""
    gone = switch.get("abandoned")
    left = (f"the switch to {gone['to']['model']} was abandoned ({rub(gone['spent_rub'])} RUB spent on it; its "
            "vectors stay in history/) · ") if gone else ""
    if not switch.get("to"):
        return left.rstrip(" ·")
    from_, to = switch_names(switch)
    move = f"{from_} -> {to}"
    this = switch.get("run")
    paid = f"{rub(switch['spent_rub'])} RUB in {count(len(switch['runs']), 'run')}"
    if switch["switched"]:
        return f"{left}{move}: switched, current/ serves {to} ({paid})"
    now = f", {rub(this['cost_rub'])} this run" if this else ""
    return (f"{left}{move}: {switch['documents_done']:,} of {switch['documents_total']:,} documents, {paid}{now}, "
            f"~{rub(switch['estimated_rub_to_finish'])} RUB to finish · its view: target/")


def _row(label: str, text: str) -> str:
    return f"  {label:<9} {text}"


def _why(reasons: dict[str, int]) -> str:
    """(reason), or (reason n, reason n, ...) for more than one, most frequent first."""
    if not reasons:
        return ""
    if len(reasons) == 1:
        return f" ({next(iter(reasons))})"
    top = sorted(reasons.items(), key=lambda kv: -kv[1])
    return " (" + ", ".join(f"{r} {n:,}" for r, n in top[:3]) + (", ..." if len(top) > 3 else "") + ")"


def _reconciliation(recon: dict[str, Any]) -> str:
    """balance delta = rows + searches + lost + others + unexplained over DIR's history, each
    part that is not 0 named (a negative one subtracted: a top-up); exact to the micro-rouble,
    as billed, so the two sides are equal as printed."""
    delta = recon.get("balance_delta_rub")
    if delta is None:
        return "the balance was not read at both ends: see the notes in summary.json"
    parts = [("rows", recon["rows_cost_rub"]), ("searches", (recon.get("searches") or {}).get("rub")),
             ("lost", (recon.get("lost") or {}).get("rub")), ("others", recon.get("others_rub")),
             ("unexplained", recon.get("unexplained_rub"))]
    if not delta and not any(value for _, value in parts):
        return "the balance did not change"
    text = f"balance {'−' if delta >= 0 else '+'}{exact(abs(delta))} = rows {exact(recon['rows_cost_rub'])}"
    text += "".join(f" {'+' if value > 0 else '−'} {name} {exact(abs(value))}" for name, value in parts[1:] if value)
    text += " RUB"
    if len(recon.get("runs") or ()) > 1:
        text += f" over {len(recon['runs'])} runs"
    return text + (" (notes in summary.json)" if recon.get("notes") else "")


def _files(output: str) -> str:
    root = output.rstrip("/")
    if is_local(output):
        return f"{root}/current/ (the view), {root}/summary.json"
    return f"{root}/summary.json (its `files` are the view)"
