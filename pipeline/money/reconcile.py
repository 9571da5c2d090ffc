"""The reconciliation of money over DIR's whole history.

Each run records its start before its first paid request (balance, key budget, stats:
pipeline/outdir/records.py) and completes it when it finishes. summary.json then reconciles
since the FIRST start:

    balance delta = Σ rows + searches + lost + others + unexplained

What the client can know, and how each part is found:
- Σ rows (current embeddings files) and Σ requests (requests files, and journal entries of
  killed runs not written yet) are exact. A search's request (its record's mode `search`)
  embeds a query and writes no rows: *searches*. Any other request billed whose rows are not
  in embeddings (vectors of the wrong length, say) is *lost* and fully known.
- The rest of the balance delta was billed for requests the job never saw answered: attempts
  that timed out, requests in flight when a run was killed, or other jobs on the same account.
  The service names none of them. Every answered request carries the balance after its
  charge, so the account's charges can be ordered and each *gap* between two known points
  (a run's start balance, an answered charge, the final balance) is money spent by charges
  the job did not see. The job knows its own unseen candidates: a retried attempt costs what
  its answered retry cost; a request in flight at a kill (an intent in the journal without an
  entry) costs what the service bills its tokens at its run's model's price
  (transforms/money/apportion.bill_micro): a DIR switched to another model holds both models'
  bills, and one price for both fits neither. A candidate can only sit in a gap after every charge answered before it was sent (clocks of
  one host assumed).
  A gap that a set of eligible candidates fills to the micro-rouble is *lost*; a gap no
  eligible candidate fits is *others*; whatever stays open, where own candidates and other
  spending cannot be told apart, is *unexplained* (with bounds in the notes), as is a balance
  that rose (a top-up). Coincidences (another job billed exactly what a lost request would
  have cost) are attributed to the job; the figures cannot tell them apart.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Collection, Mapping
from typing import Any

from pipeline.outdir.records import SEARCH, read_records
from transforms.money import journal
from transforms.money.apportion import bill_micro, from_micro, to_micro

MAX_SUBSET_BITS = 50_000_000  # exact matching of a gap by candidates: a bitset per candidate


def _time(value: str | dt.datetime) -> float:
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return value.timestamp()


@dataclasses.dataclass(frozen=True)
class Point:
    """A known point in the account's sequence of charges: the balance before and after it."""
    before: int
    after: int
    at: float          # when it was known to have happened (an answer's arrival, a balance read)


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A charge of this job that it never saw: the cost it would have had, and the earliest time."""
    cost: int
    sent_at: float
    why: str           # "retried" (an attempt before the answered one) or "in_flight"
    run_id: str


def _subset(target: int, costs: list[int]) -> list[int] | None:
    """Indexes of COSTS summing exactly to TARGET, or None (bitset subset sum)."""
    if target <= 0 or not costs or target * len(costs) > MAX_SUBSET_BITS:
        return None
    mask = (1 << (target + 1)) - 1
    layers = [1]
    for c in costs:
        layers.append((layers[-1] | (layers[-1] << c)) & mask)
    if not (layers[-1] >> target) & 1:
        return None
    chosen, rest = [], target
    for i in range(len(costs), 0, -1):
        if not (layers[i - 1] >> rest) & 1:  # TARGET needs costs[i-1]
            chosen.append(i - 1)
            rest -= costs[i - 1]
    return chosen


def split_gaps(points: list[Point], candidates: list[Candidate]) -> dict[str, Any]:
    """Walk the known points in balance order and name each gap between two of them: filled
    exactly by eligible candidates (lost), fitting none (others), or open (ambiguous); a
    balance that rose between two points is a top-up (rises)."""
    points = sorted(points, key=lambda p: (-p.before, -p.after))
    # a candidate sent after point j was answered comes after j: gap i is open to it only if
    # every point from i on was answered after it was sent
    earliest = [0.0] * len(points)
    for i in range(len(points) - 1, -1, -1):
        earliest[i] = min(points[i].at, earliest[i + 1] if i + 1 < len(points) else points[i].at)
    unmatched = sorted(candidates, key=lambda c: c.sent_at)
    lost: list[Candidate] = []
    others = ambiguous = rises = 0
    for i in range(1, len(points)):
        gap = points[i - 1].after - points[i].before
        if gap < 0:
            rises -= gap
        if gap <= 0:
            continue
        eligible = [c for c in unmatched if c.sent_at <= earliest[i]]
        chosen = _subset(gap, [c.cost for c in eligible])
        if chosen is not None:
            for j in chosen:
                lost.append(eligible[j])
                unmatched.remove(eligible[j])
            continue
        fitting = min(gap, sum(c.cost for c in eligible if c.cost <= gap))
        ambiguous += fitting
        others += gap - fitting
    return {"lost": lost, "others": others, "ambiguous": ambiguous, "rises": rises, "unmatched": unmatched}


def _price(answered: list[dict[str, Any]], catalogue: float) -> float:
    """RUB per token as billed: the catalogue's when it reproduces every bill to the
    micro-rouble, else the shortest price per 1M tokens (fewest decimals) that does (a bill
    that rounds half a micro-rouble tells a round price from one a hair off it), else the
    ratio of the largest bill, and a lost request may not match its gap."""
    billed: list[tuple[int, int]] = [(r["total_tokens"], to_micro(r["cost_rub"]))
                                     for r in answered if r["total_tokens"]]
    if not billed:
        return catalogue
    per_1m = (max((c - 0.5) / t for t, c in billed) + min((c + 0.5) / t for t, c in billed)) / 2
    tokens, cost = max(billed)
    for price in (catalogue, *(round(per_1m, d) / 1e6 for d in range(7))):
        if all(bill_micro(t, price) == c for t, c in billed):
            return price
    return cost / tokens / 1e6


def _unanswered(requests: dict[str, dict[str, Any]], intents: list[dict[str, Any]],
                records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Requests sent without an answer the job saw: each intent without a 200 (attempts from
    its error row, else 1), and what finished runs kept of theirs."""
    found = [r for rec in records for r in rec.get("unanswered", ())]
    for intent in intents:
        row = requests.get(intent["request_id"])
        if row is None or row["status"] != 200:
            found.append({**intent, "attempts": row["attempts"] if row else 1})
    return found


def _prices(answered: list[dict[str, Any]], records: list[dict[str, Any]], catalogue: Mapping[str, float],
            default: float) -> dict[str | None, float]:
    """RUB per token as billed, per run id: its model's answers and catalogue price (under
    None, for a run whose record names no model: every answer, the command's price)."""
    by_model: dict[str, list[dict[str, Any]]] = {}
    for r in answered:
        by_model.setdefault(r["model"], []).append(r)
    models = {rec["run_id"]: rec.get("model") for rec in records}
    prices: dict[str | None, float] = {None: _price(answered, default)}
    for run_id, model in models.items():
        if model is not None:
            prices[run_id] = _price(by_model.get(model, []), catalogue.get(model, prices[None]))
    return prices


def _candidates(requests: list[dict[str, Any]], unanswered: list[dict[str, Any]],
                prices: dict[str | None, float]) -> tuple[list[Candidate], int]:
    """(own charges never seen, intents torn by a kill: written before their request left, so
    a torn one was never sent). PRICES: RUB per token by run id (_prices)."""
    out = [Candidate(to_micro(r["cost_rub"]), _time(r["started_at"]), "retried", r["run_id"])
           for r in requests if r["status"] == 200 and r["cost_rub"] for _ in range(r["attempts"] - 1)]
    torn = 0
    for u in unanswered:
        if u.get("tokens") is None or u.get("at") is None:
            torn += 1
            continue
        cost = bill_micro(u["tokens"], prices.get(u["run_id"], prices[None]))
        out += [Candidate(cost, _time(u["at"]), "in_flight", u["run_id"])] * int(u.get("attempts") or 1)
    return out, torn


def _gap_notes(split: dict[str, Any], torn: int, unexplained: int) -> list[str]:
    notes = []
    if split["others"]:
        notes.append(f"{from_micro(split['others']):.6f} RUB were billed on the account between this job's own "
                     "charges that none of its requests could have cost: other spending on the same account")
    if split["ambiguous"]:
        notes.append(f"{from_micro(split['ambiguous']):.6f} RUB could be this job's unanswered requests "
                     f"({len(split['unmatched'])} candidates) or other spending: the figures "
                     "cannot tell which")
    if split["rises"]:
        notes.append(f"the balance rose by {from_micro(split['rises']):.6f} RUB between two known points "
                     "(a top-up or a refund)")
    if torn:
        notes.append(f"{torn} intents were torn by a kill before their requests left: never billed")
    if unexplained and not (split["ambiguous"] or split["rises"]):
        notes.append(f"{from_micro(unexplained):.6f} RUB of the balance delta is not explained by the known "
                     "charges and gaps (the balance was read at the first start and at the end)")
    return notes


def reconcile(output_dir: str, *, run_ids: Collection[str], requests: list[dict[str, Any]],
              rows_by_request: dict[str, int], account_after: dict[str, Any], catalogue: Mapping[str, float],
              catalogue_price: float) -> dict[str, Any]:
    """The reconciliation over DIR's whole history, from every request row in DIR (REQUESTS)
    and the rows' cost per request id; `unanswered` lists the requests of this command's runs
    (RUN_IDS: a switch has two) sent without an answer, which record_finish keeps once the
    journal is gone. CATALOGUE: RUB per token by model name; CATALOGUE_PRICE, the command's
    model's (for runs whose model is not known)."""
    records = read_records(output_dir)
    by_id = {r["request_id"]: r for r in requests}
    intents = journal.read_intents(output_dir, skip={r["request_id"] for r in requests if r["status"] == 200})
    unanswered = _unanswered(by_id, intents, [r for r in records if r["run_id"] not in run_ids])
    mine = [u for u in unanswered if u["run_id"] in run_ids]
    rows_micro = sum(rows_by_request.values())
    req_micro = sum(to_micro(r["cost_rub"] or 0) for r in requests)
    search_ids = {r["run_id"] for r in records if r.get("mode") == SEARCH}
    searches = [r for r in requests if r["run_id"] in search_ids]
    search_micro = sum(to_micro(r["cost_rub"] or 0) for r in searches)
    without_rows = [r for r in requests if r["run_id"] not in search_ids
                    and to_micro(r["cost_rub"] or 0) > rows_by_request.get(r["request_id"], 0)]
    lost_known = req_micro - rows_micro - search_micro
    recon = {"since": {k: records[0].get(k) for k in ("run_id", "started_at")} if records else None,
             "runs": [r["run_id"] for r in records],
             "rows_cost_rub": from_micro(rows_micro), "requests_cost_rub": from_micro(req_micro),
             "rows_minus_requests_rub": from_micro(rows_micro - req_micro), "unanswered": mine,
             "searches": {"count": len(searches), "rub": from_micro(search_micro)}}
    notes = []
    # a killed run never finished: its journaled answers reach rows only through a later run's input
    killed = {r["run_id"] for r in records if "finished_at" not in r and r["run_id"] not in run_ids}
    for journaled, why in ((False, "were not delivered (dead-lettered after billing, e.g. vectors of the wrong "
                                   "length)"),
                           (True, "were journaled by a killed run for texts no later input had (documents "
                                  "edited or removed before the run that resumed it)")):
        these = [r for r in without_rows if (r["run_id"] in killed) == journaled]
        if these:
            rub = sum(to_micro(r["cost_rub"] or 0) - rows_by_request.get(r["request_id"], 0) for r in these)
            notes.append(f"{len(these)} requests were billed {from_micro(rub):.6f} RUB but their answers {why}")
    first = records[0] if records else {}
    before, after = first.get("balance"), account_after.get("balance")
    lost: dict[str, Any] = {"count": len(without_rows), "rub": from_micro(lost_known),
            "answered_not_delivered": {"count": len(without_rows), "rub": from_micro(lost_known)}}
    recon.update(balance_delta_rub=None, balance_minus_requests_rub=None, lost=lost, others_rub=None,
                 unexplained_rub=None)
    m_before = (first.get("stats") or {}).get("monthly_usage")
    m_after = (account_after.get("stats") or {}).get("monthly_usage")
    stats_delta = to_micro(m_after) - to_micro(m_before) if m_before is not None and m_after is not None else None
    recon["stats_delta_rub"] = from_micro(stats_delta) if stats_delta is not None else None
    if before is None or after is None:
        notes.append("the balance was not read at the first start or at the end: the difference between "
                     "what was billed and what the requests cost cannot be named")
        recon["notes"] = notes
        return recon
    delta = to_micro(before) - to_micro(after)
    recon.update(balance_delta_rub=from_micro(delta), balance_minus_requests_rub=from_micro(delta - req_micro))
    charged = [r for r in requests if r["cost_rub"]]
    if any(r["balance_after"] is None for r in charged):
        notes.append("the service did not report the balance after every request: the "
                     f"{from_micro(delta - req_micro):.6f} RUB not covered by requests cannot be placed")
        recon.update(others_rub=None, unexplained_rub=from_micro(delta - req_micro), notes=notes)
        return recon
    now = dt.datetime.now(dt.UTC).timestamp()
    points = [Point(to_micro(r["balance"]), to_micro(r["balance"]), _time(r["started_at"]))
              for r in records if r.get("balance") is not None]
    points += [Point(to_micro(r["balance_after"]) + to_micro(r["cost_rub"]), to_micro(r["balance_after"]),
                     _time(r["started_at"]) + (r["latency_ms"] or 0) / 1000) for r in charged]
    points.append(Point(to_micro(after), to_micro(after), now))
    prices = _prices([r for r in requests if r["status"] == 200], records, catalogue, catalogue_price)
    candidates, torn = _candidates(requests, unanswered, prices)
    split = split_gaps(points, candidates)
    unseen = split["lost"]
    lost_unseen = sum(c.cost for c in unseen)
    for why, text in (("retried", "attempts that timed out or were cut after the service billed them "
                                  "(the same request was answered on a later attempt)"),
                      ("in_flight", "requests in flight when a run was killed or gave up, billed without "
                                    "an answer reaching the journal")):
        found = [c for c in unseen if c.why == why]
        lost[why] = {"count": len(found), "rub": from_micro(sum(c.cost for c in found))}
        if found:
            notes.append(f"{len(found)} {text}: {from_micro(sum(c.cost for c in found)):.6f} RUB, matched to "
                         "the micro-rouble against gaps in the balance after each answered request")
    lost.update(count=lost["count"] + len(unseen), rub=from_micro(lost_known + lost_unseen))
    unexplained = delta - req_micro - lost_unseen - split["others"]  # the ambiguous gaps, top-ups
    recon.update(others_rub=from_micro(split["others"]), unexplained_rub=from_micro(unexplained))
    notes += _gap_notes(split, torn, unexplained)
    if stats_delta is not None and stats_delta != delta:
        notes.append(f"the stats show {from_micro(stats_delta):.6f} RUB spent, the balance fell by "
                     f"{from_micro(delta):.6f} RUB: top-ups, or spending older than the stats window")
    recon["notes"] = notes
    return recon
