"""Why a chunk is pending: not embedded, for a reason a later run can clear (no Beam here).

The one table of those reasons. The job's sender gives them (transforms/embed/), summary.json's
exit code and the terminal read them (pipeline/), the library counts and words its results by
them (embedpipe/). A reason not in this table is a failure: a dead letter, never sent again.
It lives in transforms/, the lowest layer that has the notions it names (a budget, a breaker,
a store of paid texts); service/ knows HTTP, not what a run does about it.

Each reason, a member of Pending, has its name (the `reason` column of pending-*.parquet,
summary.json's `pending_reasons`), the exit code of a run left with it, the words a person reads
(the library's `<column>_error_detail`) and, where the generic advice would be wrong, what to do
next. The steps give a pending row a Pending, never a string, so each reason they give is one
of the table's.
"""
from __future__ import annotations

import enum
from collections.abc import Iterable

# The exit codes a run's pending rows give it (design.md; pipeline/exits.py takes them from here).
EXIT_FAILED, EXIT_DOES_NOT_FIT, EXIT_PARTIAL = 1, 3, 4
_PRECEDENCE = (EXIT_FAILED, EXIT_DOES_NOT_FIT, EXIT_PARTIAL)   # a run with several ends with the first


class Pending(enum.StrEnum):
    """A pending reason, and its row of the table: the type every step that leaves a row pending
    gives it with (transforms/embed/send.py's Outcome and Breaker, the budget guard's stop, the
    Embed step, the store's lost texts), so a reason not in the table is a type error (make lint)."""
    exit_code: int
    words: str               # what it means, in a sentence that is true of every row it is given to
    advice: str | None       # what to do next where the generic advice would be wrong: a str.format
                             # template ({again}: the command to run again)

    def __new__(cls, value: str, exit_code: int, words: str, advice: str | None = None) -> Pending:
        member = str.__new__(cls, value)
        member._value_ = value
        member.exit_code, member.words, member.advice = exit_code, words, advice
        return member

    BUDGET = ("budget_exhausted", EXIT_PARTIAL,
              "not embedded: the spendable amount (max_spend_rub, a daily or monthly cap, the balance less the "
              "reserve) ran out before it was answered")
    BALANCE = "insufficient_balance", EXIT_PARTIAL, "not sent: the account's balance ran out (HTTP 402)"
    UNAUTHORIZED = "unauthorized", EXIT_FAILED, "not sent: the service refused the key (HTTP 401)"
    FORBIDDEN = "forbidden", EXIT_FAILED, "not sent: the key may not use the model (HTTP 403)"
    UNAVAILABLE = ("service_unavailable", EXIT_FAILED,
                   "not embedded: the service failed, or refused (HTTP 429), through every retry")
    PREFLIGHT = ("estimate_exceeds_budget", EXIT_DOES_NOT_FIT,
                 "not sent: the run's estimate does not fit the spendable amount")
    INVALID = ("invalid_answers", EXIT_FAILED,
               "not sent: the service's answers were of no use (vectors of the wrong length, or the same refusal "
               "for input after input)")
    TIMED_OUT = ("timed_out", EXIT_FAILED,
                 "not embedded: the service answered slower than client.read_timeout_max_s; a request that timed "
                 "out was sent and may have been billed, twice at most",
                 "the service answered slower than client.read_timeout_max_s: raise it in a YAML file holding "
                 "`client: {{read_timeout_max_s: SECONDS}}` (or in the --run-config file you pass) and run "
                 "{again} adding --run-config FILE")
    STORE_CHANGED = ("store_changed", EXIT_PARTIAL,
                     "not sent: the store of paid texts lost it between its lookup and its read (a compaction); "
                     "sent again by the next run")


REASONS: dict[str, Pending] = {r.value: r for r in Pending}   # by name: what files and summary.json hold


def exit_code(reasons: Iterable[str]) -> int:
    """The exit code of a run whose rows are pending for REASONS: a failure before an estimate
    that does not fit before a budget that ran out; 0 for none. A reason not in the table is a
    failure: rows were left unsent for a reason nobody named."""
    codes = {REASONS[r].exit_code if r in REASONS else EXIT_FAILED for r in reasons}
    return next((code for code in _PRECEDENCE if code in codes), 0)


def detail(reason: str, message: str | None = None) -> str:
    """What a person reads about a text pending for REASON; MESSAGE: what stopped the sending."""
    words = REASONS[reason].words if reason in REASONS else f"not embedded: {reason}"
    return f"{words} ({message})" if message else words
