"""`plan`: what a run would send and cost, against what may be spent. Sends no embeddings."""
from __future__ import annotations

from typing import Any

import pyarrow.compute as pc

from pipeline.checks import switching
from pipeline.checks.inputs import InputInfo, inspect_input
from pipeline.checks.nul import warn_nul
from pipeline.checks.prior import check_kept, check_model, prior, removed
from pipeline.checks.scan import Scan, scan_input
from pipeline.commands.run import client_for
from pipeline.money import account as acct
from pipeline.money.measure import TOTALS, exact_totals
from pipeline.outdir import OutputDir
from pipeline.outdir import switch as switches
from pipeline.settings.job import RESUME, Job
from pipeline.terminal.summary import switch_names
from transforms.money import preflight
from transforms.money.apportion import from_micro, to_micro
from transforms.read.changes import CHANGES, counts


SUMMED = ("chunks", "distinct_chunks", "requests", "prompt_tokens", "estimated_cost_rub", "worst_case_rub")


def plan(job: Job, info: InputInfo | None = None, account: acct.Account | None = None,
         scan: Scan | None = None, *, compare: bool = False) -> dict[str, Any]:
    """What the run would send and cost. A switch (--switch-model) plans both of its shares:
    the day's changes for the served model, what the target still lacks; COMPARE (`--model
    all`): each model as if DIR were its own, with no check of DIR's model."""
    opts = job.opts
    info = info or inspect_input(opts.input, opts.id_column, opts.text_column, job.keep_columns)
    if account is None:
        with client_for(job) as client:
            account = acct.read_account(client, need_stats=bool(job.caps.by_name()))
    if scan is None:
        scan = scan_input(info, opts.id_column, opts.text_column)
        warn_nul(info, opts.id_column, opts.text_column, job.chunk_text)
    out = OutputDir(opts.output) if opts.output else None
    decision = switching.decide(job, out, act=False) if out and not compare else switching.Decision(None)
    if decision.switching is None or out is None:
        if out is not None and not compare:
            check_model(job, out)
            info = check_kept(job, out, info)
        return _plan(job, out, info, account, scan)
    served = _plan(decision.switching.served, out, check_kept(job, out, info), account, scan)
    target = _plan(job, out.target(), check_kept(job, out.target(), check_kept(job, out, info)), account, scan)
    both = {**target, **{k: round(served[k] + target[k], 6) for k in SUMMED}, "changes": served["changes"]}
    both["fits"] = preflight.fits(to_micro(both["worst_case_rub"]), both["spendable_rub"])
    status = switches.status(out, decision.switching.record, pc.drop_null(scan.ids), target["price_rub_per_1m_tokens"]
                             / 1e6, False)
    status["estimated_rub_to_finish"] = target["estimated_cost_rub"]
    part = ("model", "changes", "documents") + SUMMED
    return {**both, "served": {k: served[k] for k in part}, "target": {k: target[k] for k in part},
            "switch": {k: v for k, v in status.items() if k not in ("files", "switched")}}


def _plan(job: Job, out: OutputDir | None, info: InputInfo, account: acct.Account, scan: Scan) -> dict[str, Any]:
    opts, model, s = job.opts, job.model, job.settings
    learned = out.learned_price(model.name) if out else None
    price = learned if learned is not None else model.price_per_token
    before = prior(job, out, checked=False)
    metrics = exact_totals(job, info, before, scan, price, job.initial_margin(learned is not None))
    requests_n, inputs, chunks, tokens = (metrics.get(n, 0) for n in TOTALS)
    changes = counts({c: metrics.get(f"changed_{c}", 0) for c in CHANGES}, len(pc.drop_null(scan.ids)),
                     0 if job.mode == RESUME else len(removed(before, scan.ids)))
    spendable = acct.spendable(account, s.budget.reserve_rub, opts.max_spend_rub, job.caps)
    estimate = round(tokens * price, 6)
    return {
        "model": model.name, "files": len(info.files), "documents": metrics.get("documents", 0),
        "changes": changes, "chunks": chunks, "distinct_chunks": inputs, "requests": requests_n,
        "prompt_tokens": tokens,
        "price_rub_per_1m_tokens": round(price * 1e6, 6),
        "price_source": "learned from earlier requests" if learned is not None else "configs/models.yaml estimate",
        "estimated_cost_rub": estimate, "balance_rub": account.balance, "key_budget_rub": account.budget,
        "max_spend_rub": opts.max_spend_rub, "reserve_rub": s.budget.reserve_rub,
        "stats": account.stats, "daily_cap_rub": job.caps.daily_cap_rub,
        "monthly_cap_rub": job.caps.monthly_cap_rub, "binding_limit": spendable.binding,
        "spendable_rub": round(spendable.rub, 6),
        "worst_case_rub": from_micro(metrics.get("plan_worst_case_micro", 0)),
        "fits": preflight.fits(metrics.get("plan_worst_case_micro", 0), spendable.rub),
    }


def _cap(p: dict[str, Any], cap: str, usage: str) -> str | None:
    return None if p[cap] is None else f"{p[cap]} (the account spent {p['stats'][usage]})"


def render(p: dict[str, Any]) -> str:
    changes = " / ".join(str(p["changes"][k]) for k in ("added", "edited", "removed", "unchanged", "resumed"))
    rows = [("model", p["model"]), ("files / documents", f"{p['files']} / {p['documents']}"),
            ("added / edited / removed / unchanged / resumed", changes),
            ("chunks (distinct texts)", f"{p['chunks']} ({p['distinct_chunks']})"),
            ("requests", p["requests"]), ("prompt tokens", p["prompt_tokens"]),
            ("price RUB per 1M tokens", f"{p['price_rub_per_1m_tokens']} ({p['price_source']})"),
            ("estimated cost RUB", f"{p['estimated_cost_rub']:.6f}"),
            ("worst case RUB (guard's margin)", f"{p['worst_case_rub']:.6f}"),
            ("balance RUB", p["balance_rub"]), ("key budget RUB", p["key_budget_rub"]),
            ("--max-spend-rub", p["max_spend_rub"]), ("reserve RUB", p["reserve_rub"]),
            ("spent today / 31 days RUB", "n/a" if not p["stats"] else
             f"{p['stats']['daily_usage']} / {p['stats']['monthly_usage']}"),
            ("daily cap RUB (the service's day)", _cap(p, "daily_cap_rub", "daily_usage")),
            ("monthly cap RUB (last 31 days)", _cap(p, "monthly_cap_rub", "monthly_usage")),
            ("spendable RUB", f"{p['spendable_rub']:.6f} ({p['binding_limit']} binds)"),
            ("fits", "yes" if p["fits"] else "NO: the worst case exceeds the spendable amount")]
    if "switch" in p:
        sw, served, target = p["switch"], p["served"], p["target"]
        from_, to = switch_names(sw)
        rows[:1] = [("switch", f"{from_} -> {to}: {sw['documents_done']} of "
                               f"{sw['documents_total']} documents done, {sw['spent_rub']:.6f} RUB spent so far"),
                    ("the day's changes RUB",
                     f"{served['estimated_cost_rub']:.6f} ({served['model']}, the served view)"),
                    ("to finish RUB", f"{target['estimated_cost_rub']:.6f} ({target['model']}, what its view lacks)")]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {'-' if v is None else v}" for k, v in rows)


def plan_models(jobs: list[Job]) -> list[dict[str, Any]]:
    """One plan per model (`--model all` or a comma list) over the same corpus and the same
    reading of the account. Each model runs its own split and pack: chunk limits differ."""
    first = jobs[0]
    info = inspect_input(first.opts.input, first.opts.id_column, first.opts.text_column, first.keep_columns)
    with client_for(first) as client:
        account = acct.read_account(client, need_stats=bool(first.caps.by_name()))
    scan = scan_input(info, first.opts.id_column, first.opts.text_column)  # the same for every model
    warn_nul(info, first.opts.id_column, first.opts.text_column, first.chunk_text)
    return [plan(job, info, account, scan, compare=True) for job in jobs]


COMPARE = (("model", "model", "{}"), ("tokens", "prompt_tokens", "{}"), ("factor", "safety_factor", "{:g}"),
           ("requests", "requests", "{}"), ("RUB", "estimated_cost_rub", "{:.6f}"),
           ("worst RUB", "worst_case_rub", "{:.6f}"), ("RUB per 1k docs", "rub_per_1k_documents", "{:.4f}"),
           ("fits", "fits", "{}"))


def render_comparison(plans: list[dict[str, Any]], jobs: list[Job]) -> str:
    """One row per model, cheapest first; tokens are cl100k_base counts, which a model whose own
    tokenizer may count more is planned with (factor = its safety factor: chunks are cut at
    max_input_tokens x factor, and the worst case divides by it)."""
    factor = {job.model.name: job.model.safety_factor for job in jobs}
    rows, unplanned = [], [p for p in plans if "not_planned" in p]
    planned = [p for p in plans if "not_planned" not in p]
    for p in sorted(planned, key=lambda p: (p["estimated_cost_rub"], p["model"])):
        per_1k = p["estimated_cost_rub"] * 1000 / p["documents"] if p["documents"] else 0.0
        values = {**p, "safety_factor": factor[p["model"]], "rub_per_1k_documents": per_1k}
        rows.append([("yes" if v else "NO") if isinstance(v, bool) else fmt.format(v)
                     for _, key, fmt in COMPARE for v in [values[key]]])
    rows += [[p["model"], *["-"] * (len(COMPARE) - 2), "NO"] for p in unplanned]
    cells = [[title for title, _, _ in COMPARE]] + rows
    widths = [max(len(r[i]) for r in cells) for i in range(len(COMPARE))]
    table = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
             for r in cells]
    first = planned[0]
    return "\n".join(table + ["", f"{first['files']} files, {first['documents']} documents; spendable "
                                   f"{first['spendable_rub']:.6f} RUB; fits: the worst case within it"]
                      + [f"{p['model']}: not planned: {p['not_planned']}" for p in unplanned])

