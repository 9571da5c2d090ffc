"""`plan`: what a run would send and cost, against what may be spent. Sends no embeddings."""
from __future__ import annotations

from pipeline import account as acct
from pipeline.inputs import inspect_input
from pipeline.job import Job
from pipeline.measure import TOTALS, exact_totals
from pipeline.resume import known_sources, learned_price
from pipeline.run import client_for
from pipeline.scan import scan_input
from transforms import preflight
from transforms.apportion import from_micro


def plan(job: Job) -> dict:
    opts, model, s = job.opts, job.model, job.settings
    info = inspect_input(opts.input, opts.id_column, opts.text_column, job.keep_columns)
    with client_for(job) as client:
        account = acct.read_account(client, need_stats=bool(job.caps.by_name()))
    learned = learned_price(opts.output)
    price = learned if learned is not None else model.price_per_token
    scan = scan_input(info.files, opts.id_column, opts.text_column)
    metrics = exact_totals(job, info, known_sources(job), scan, price, job.initial_margin(learned is not None))
    requests_n, inputs, chunks, tokens = (metrics.get(n, 0) for n in TOTALS)
    spendable = acct.spendable(account, s.budget.reserve_rub, opts.max_spend_rub, job.caps)
    estimate = round(tokens * price, 6)
    return {
        "model": model.name, "files": len(info.files), "documents": metrics.get("documents", 0),
        "chunks": chunks, "distinct_chunks": inputs, "requests": requests_n, "prompt_tokens": tokens,
        "price_rub_per_1m_tokens": round(price * 1e6, 6),
        "price_source": "learned from earlier requests" if learned is not None else "configs/models.yaml estimate",
        "estimated_cost_rub": estimate, "balance_rub": account.balance, "key_budget_rub": account.budget,
        "max_spend_rub": opts.max_spend_rub, "reserve_rub": s.budget.reserve_rub,
        "stats": account.stats, "daily_cap_rub": job.caps.daily_cap_rub,
        "monthly_cap_rub": job.caps.monthly_cap_rub, "binding_limit": spendable.binding,
        "spendable_rub": round(spendable, 6),
        "worst_case_rub": from_micro(metrics.get("plan_worst_case_micro", 0)),
        "fits": preflight.fits(metrics.get("plan_worst_case_micro", 0), spendable),
    }


def _cap(p: dict, cap: str, usage: str) -> str | None:
    return None if p[cap] is None else f"{p[cap]} (the account spent {p['stats'][usage]})"


def render(p: dict) -> str:
    rows = [("model", p["model"]), ("files / documents", f"{p['files']} / {p['documents']}"),
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
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {'-' if v is None else v}" for k, v in rows)
