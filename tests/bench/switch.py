"""Switching a living DIR to another model over several capped runs (README, "Switching models").

Day 1: a fresh run of model A on the bench corpus. Then one run a day, the corpus changed
before each as in the Sync section (1% edited, 0.5% removed, 1% added):
`run --model B --sync --switch-model --allow-partial --max-spend-rub X`, X a third of what
`plan` estimates B's view costs, so that the switch takes at least three runs. After every
run, on the whole DIR/current/ (what a glob reader gets): its doc_ids are exactly the day's
(0 removed served, 0 missing), every document's chunk hashes are its current text's split for
the served model (0 stale; all documents, not a sample), no document mixes versions or models,
and one model in the view. Then, from the sandbox's ledger: no (model, text) billed twice, and
what B cost against its distinct texts' tokens x B's price (to 1e-6 RUB per request). Then the
switch back to A at once (the corpus unchanged: 0 requests) and a plain `--sync` of the next
day, beside the Sync section's day 2 when both ran in this bench.

A 2-model catalogue: A keeps the catalogue's text-embedding-3-small; B is
text-embedding-3-large with a 2,048-token chunk limit (the switch splits anew) at its own
price; both at 1,536 dimensions, so that memory compares switch machinery, not vector sizes.
Zero-latency sandbox. Peak RSS (VmHWM) of each run against a fresh 2,000-document run of A.

Commit seconds, from what DIR holds (summary.json's timing does not have them): from the newest
file the part's job wrote under history/<run>/ to its view manifest's `committed_at`
(_views/<run>.json). The switching run's target manifest is written again when it becomes
current, so its figure runs through the switch. "Served sync commit": the served model's commit
of the day's changes, the step a plain `--sync` takes.
"""
from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import yaml

from pipeline.settings.config import default_settings_text, parse_settings
from service.catalog import load_models, parse_models
from service.sandbox.store import read_ledger
from service.tokenizer import get_encoding
from tests.bench.corpus import SCHEMA, make_documents
from tests.bench.measure import Measured, run_measured
from tests.bench.report import table
from tests.bench.sync import ADDED, EDITED, REMOVED, next_day
from transforms.read.split import SplitConfig, Splitter

A, B = "text-embedding-3-small", "text-embedding-3-large"
B_CHUNK_TOKENS, DIMENSIONS = 2048, 1536
RUNS_AT_LEAST = 3     # the per-run cap: B's planned cost / this
MAX_RUNS = 8


def write_models(path: Path) -> Path:
    doc = {"models": {name: {k: v for k, v in dataclasses.asdict(m).items() if k != "name"}
                      for name, m in load_models().items() if name in (A, B)}}
    doc["models"][A]["dimensions"] = doc["models"][B]["dimensions"] = DIMENSIONS
    doc["models"][B]["max_input_tokens"] = B_CHUNK_TOKENS
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def _ts(iso: str) -> float:
    return dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def day_after(docs: list[dict], day: int) -> tuple[list[dict], dict[str, set]]:
    """The Sync section's next day, with the added documents' ids made unique to DAY."""
    rows, changed = next_day(docs, seed=day)
    added = {i: f"d{day}-{i}" for i in changed["added"]}
    rows = [{**d, "id": added[d["id"]]} if d["id"] in added else d for d in rows]
    return rows, {**changed, "added": set(added.values())}


class Expected:
    """Every document's chunk hashes as the job splits its current text for one model
    (remembered per document while its text stays the same: each day splits only what changed)."""

    def __init__(self, chunk_tokens: int):
        split = parse_settings(default_settings_text()).split
        self._splitter = Splitter(get_encoding(), SplitConfig(max_tokens=chunk_tokens,
                                                              overlap_tokens=split.overlap_tokens,
                                                              boundary_window=split.boundary_window))
        self._known: dict[str, tuple[str, list]] = {}

    def hashes(self, doc: dict) -> list:
        known = self._known.get(doc["id"])
        if known is None or known[0] != doc["text"]:
            known = (doc["text"], sorted(c.text_sha256 for c in self._splitter.split(doc["id"], doc["text"])))
            self._known[doc["id"]] = known
        return known[1]


def _rows(folder: Path) -> pa.Table | None:
    files = sorted(folder.glob("embeddings-*.parquet"))
    if not files:
        return None
    return pa.concat_tables(pq.read_table(f, columns=["doc_id", "chunk_index", "chunk_count", "text_sha256", "model"])
                            for f in files)


def check(out: Path, day: list[dict], expected: dict[str, Expected]) -> dict:
    """The reader's checks on the whole of DIR/current/ (counts of what is wrong: all 0), and
    the models current/ and target/ hold."""
    t = _rows(out / "current")
    served: dict[str, list] = collections.defaultdict(list)
    models = set()
    if t is not None:
        models = set(pc.unique(t.column("model")).to_pylist())
        for doc, index, count, sha, model in zip(*(t.column(c).to_pylist() for c in t.column_names), strict=True):
            served[doc].append((index, count, sha, model))
    target = _rows(out / "target") if (out / "target").exists() else None
    mixed = sum(1 for rows in served.values()
                if len({r[1] for r in rows}) != 1 or len({r[3] for r in rows}) != 1
                or sorted(r[0] for r in rows) != list(range(rows[0][1])))
    model = next(iter(models)) if len(models) == 1 else None
    stale = sum(1 for d in day if d["id"] in served and
                (model is None or sorted(r[2] for r in served[d["id"]]) != expected[model].hashes(d)))
    ids = {d["id"] for d in day}
    return {"stale": stale, "mixed": mixed, "removed served": len(set(served) - ids),
            "missing": len(ids - set(served)), "current/": _models(t), "target/": _models(target)}


def _models(t: pa.Table | None) -> str:
    return "-" if t is None else ", ".join(sorted(pc.unique(t.column("model")).to_pylist())) or "(empty)"


def commit_s(out: Path, run_id: str) -> float:
    """From the newest file RUN_ID's job wrote to its view manifest's committed_at."""
    committed = _ts(json.loads((out / "_views" / f"{run_id}.json").read_text())["committed_at"])
    job_end = max(p.stat().st_mtime for p in (out / "history" / run_id).iterdir() if p.is_file())
    return committed - job_end


def ledger_checks(db: Path, out: Path, price_b: float) -> dict:
    """No (model, text) billed twice; what B cost against its distinct texts' tokens x price."""
    charges = list(read_ledger(str(db)))
    sent = collections.Counter((c["model"], h) for c in charges for h in c["input_sha256"])
    b_charges = [c for c in charges if c["model"] == B]
    tokens: dict[str, int] = {}
    for f in (out / "history").glob("*/embeddings-*.parquet"):
        t = pq.read_table(f, columns=["text_sha256", "n_tokens", "model"])
        t = t.filter(pc.equal(t.column("model"), B))
        tokens.update(zip(t.column("text_sha256").to_pylist(), t.column("n_tokens").to_pylist(), strict=True))
    b_texts = {h for c in b_charges for h in c["input_sha256"]}
    cost = sum(c["cost_rub"] for c in b_charges)
    distinct = sum(tokens.get(h, 0) for h in b_texts) * price_b
    return {"billed twice": sum(1 for n in sent.values() if n > 1), "b_requests": len(b_charges),
            "b_texts": len(b_texts), "b_not_in_history": len(b_texts - set(tokens)), "b_cost": cost,
            "b_distinct_cost": distinct, "requests": len(charges)}


def run(bench, docs: int) -> None:
    from tests.bench.run_bench import _env

    work = bench.work / "switch"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    models = write_models(work / "models.yaml")
    specs = parse_models(models.read_text())
    expected = {A: Expected(specs[A].chunk_tokens), B: Expected(specs[B].chunk_tokens)}
    corpus, out = work / "corpus.parquet", work / "out"

    def write(rows: list[dict], path: Path = corpus) -> None:
        pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path, row_group_size=2000, compression="zstd")

    def pipeline(label: str, sb, model: str, *extra: str, path: Path = corpus, output: Path = out
                 ) -> tuple[Measured, dict]:
        """A run as a child process; exit 4 (a switch not complete yet) is not a failure."""
        bench.say(f"  running {label} ...")
        argv = ["-m", "pipeline", "run", "--input", str(path), "--output", str(output), "--model", model,
                "--base-url", sb.base_url, "--models-config", str(models), *extra]
        m = run_measured(argv, env=_env(), sandbox_pid=sb.pid, log_path=str(bench.logs / f"{label}.log"))
        if m.returncode not in (0, 4):
            raise SystemExit(f"{label} exited with {m.returncode}:\n{m.log}")
        s = json.loads((output / "summary.json").read_text())
        bench.say(f"    exit {m.returncode}, {m.wall_s:.1f} s wall, peak RSS {m.peak_rss_mb:.0f} MB")
        return m, s

    small = work / "small.parquet"
    write(make_documents(2000), small)
    with bench.sandbox("sandbox-switch-2k", ["--models", str(models)]) as sb:
        m_small, _ = pipeline("switch-fresh-2k", sb, A, path=small, output=work / "out-2k")
    shutil.rmtree(work / "out-2k", ignore_errors=True)

    rows, ratio = [], lambda m: m.peak_rss_mb / m_small.peak_rss_mb
    rows.append(["fresh A, 2,000 documents (memory reference)", m_small.returncode, "", "", "", "", "", "", "", "",
                 "", "", "", m_small.peak_rss_mb, 1.0, m_small.wall_s, "", ""])

    checked: list[dict] = []

    def row(label, m, s, wrong, served_commit, target_commit="") -> list:
        checked.append(wrong)
        sw = s.get("switch") or {}
        target = [f"{sw['documents_done']:,} / {sw['documents_total']:,}", sw["run"]["cost_rub"], sw["spent_rub"],
                  sw["estimated_rub_to_finish"]] if "run" in sw else ["", "", "", ""]
        return [label, m.returncode, s["cost_rub"], *target, wrong["stale"], wrong["mixed"], wrong["removed served"],
                wrong["missing"], wrong["current/"], wrong["target/"], m.peak_rss_mb, ratio(m), m.wall_s,
                served_commit, target_commit]

    day = make_documents(docs)
    write(day)
    with bench.sandbox("sandbox-switch", ["--models", str(models)]) as sb:
        db = Path(sb.db)
        m, s = pipeline("switch-day1", sb, A)
        rows.append(row(f"day 1: fresh A, {docs:,} documents", m, s, check(out, day, expected),
                        commit_s(out, s["run_id"]), ""))
        planned = json.loads(subprocess.run(
            [sys.executable, "-m", "pipeline", "plan", "--input", str(corpus), "--output", str(out), "--model", B,
             "--base-url", sb.base_url, "--models-config", str(models), "--sync", "--switch-model", "--json"],
            env=_env(), check=True, capture_output=True, text=True).stdout)
        cap = planned["target"]["estimated_cost_rub"] / RUNS_AT_LEAST
        switch_walls, switched, n = [], False, 0
        while not switched:
            n += 1
            if n > MAX_RUNS:
                raise SystemExit(f"the switch did not complete in {MAX_RUNS} runs: {s.get('switch')}")
            day, changed = day_after(day, n + 1)
            write(day)
            m, s = pipeline(f"switch-run-{n}", sb, B, "--sync", "--switch-model", "--allow-partial",
                            "--max-spend-rub", f"{cap:.6f}")
            sw = s["switch"]
            switched = sw["switched"]
            if switched != (m.returncode == 0):
                raise SystemExit(f"switch run {n}: exit {m.returncode} with switched={switched}")
            switch_walls.append(m)
            switched_to = check(out, day, expected)
            rows.append(row(f"switch run {n} (day {n + 1}: " + ", ".join(f"{k} {len(v):,}" for k, v in changed.items())
                            + ")", m, s, switched_to, commit_s(out, s["run_id"]),
                            commit_s(out, sw["run"]["run_id"])))
        spent_reported = sw["spent_rub"]
        money = ledger_checks(db, out, specs[B].price_per_token)

        before = money["requests"]
        m, s = pipeline("switch-back", sb, A, "--sync", "--switch-model")
        back_requests = sum(1 for _ in read_ledger(str(db))) - before
        sw = s.get("switch", {})
        rows.append(row("switch back to A at once (corpus unchanged)", m, s, check(out, day, expected),
                        commit_s(out, s["run_id"]), commit_s(out, sw["run"]["run_id"]) if "run" in sw else ""))
        back = (m.returncode, back_requests, sw.get("switched"))

        day, changed = day_after(day, n + 2)
        write(day)
        m_plain, s = pipeline("switch-plain-sync", sb, A, "--sync")
        rows.append(row(f"day {n + 2}: plain --sync of A, no switch", m_plain, s, check(out, day, expected),
                        commit_s(out, s["run_id"]), ""))
        money_end = ledger_checks(db, out, specs[B].price_per_token)

    headers = ["run", "exit", "served model's sync RUB", "target documents done / total", "target RUB this run",
               "target RUB so far", "target RUB to finish (estimated)", "stale", "mixed", "removed served", "missing",
               "current/ models", "target/ models", "peak RSS MB", "RSS / fresh 2k", "wall s", "served sync commit s",
               "target commit s"]
    bench.emit(table(headers, rows,
                     f"Model switch: {docs:,} documents, {A} -> {B} (chunks of {specs[A].chunk_tokens:,} -> "
                     f"{specs[B].chunk_tokens:,} tokens, {specs[A].price_per_token * 1e6:g} -> "
                     f"{specs[B].price_per_token * 1e6:g} RUB per 1M; {DIMENSIONS} dimensions), "
                     f"--max-spend-rub {cap:.2f} per run (plan's estimate for B / {RUNS_AT_LEAST}), "
                     f"--allow-partial; {EDITED:.1%} edited, {REMOVED:.1%} removed, {ADDED:.1%} added before every "
                     "run; zero-latency sandbox"))
    tol = 1e-6 * money["b_requests"]
    worst = max(ratio(m) for m in switch_walls)
    wrong = sum(w[k] for w in checked for k in ("stale", "mixed", "removed served", "missing"))
    lines = [
        f"switch runs: {len(switch_walls)} (exit 4 until the last, then 0); the served view after each of the "
        f"{len(checked)} runs, on all documents: {wrong} stale, mixed, removed or missing in all (target 0); "
        f"runs whose current/ holds more than one model: {sum(', ' in w['current/'] for w in checked)}",
        f"after the switch, current/ holds {switched_to['current/']} only (every row B's: "
        f"{switched_to['current/'] == B}); target/ {switched_to['target/']}",
        f"(model, text) billed twice in the sandbox ledger: {money_end['billed twice']} "
        f"(of {money_end['requests']} requests, whole section)",
        f"B's cost: {money['b_cost']:.6f} RUB in {money['b_requests']} requests against {money['b_distinct_cost']:.6f} "
        f"for its {money['b_texts']:,} distinct texts (tokens x price): difference "
        f"{abs(money['b_cost'] - money['b_distinct_cost']):.6f} RUB (tolerance {tol:.6f}); "
        f"summary.json's switch.spent_rub {spent_reported:.6f}; B texts paid and not in history: "
        f"{money['b_not_in_history']}",
        f"peak RSS of the switch runs / fresh 2k run: at most {worst:.2f} (target <= 1.5)",
        f"switch back to A at once: exit {back[0]}, {back[1]} requests (corpus unchanged; target 0), "
        f"switched {back[2]}",
    ]
    sync_figures = getattr(bench, "sync_figures", None)
    plain = f"{m_plain.wall_s:.1f} s wall, peak RSS {m_plain.peak_rss_mb:.0f} MB"
    if sync_figures:
        lines.append(f"a day's --sync with no switch: {plain} here (day {n + 2}, after the switch and back) beside "
                     f"the Sync section's day 2: {sync_figures['wall_s']:.1f} s wall, peak RSS "
                     f"{sync_figures['peak_rss_mb']:.0f} MB on {sync_figures['docs']:,} documents")
    else:
        lines.append(f"a day's --sync with no switch: {plain} (day {n + 2}); the Sync section did not run in "
                     "this bench: compare with its figures in docs/BENCH.md")
    bench.emit("Model switch, totals:\n\n" + "\n".join(f"- {line}" for line in lines))
    bench.emit("Commit s: from the newest file the part's job wrote under history/<run>/ to its view manifest's "
               "committed_at (the target's on the switching run is rewritten when it becomes current: its figure "
               "includes the switch). Served sync: the served model's share of the run, the day's changes; target: "
               "the other model's view (B; A on the switch back), from summary.json's switch. Checks on all "
               "documents of current/ as a glob reader sees it.")
    (work / "checks.json").write_text(json.dumps({"money": money, "money_end": money_end, "back": back}))
    shutil.rmtree(out, ignore_errors=True)
    for path in (corpus, small):
        path.unlink(missing_ok=True)
