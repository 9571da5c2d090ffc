"""The next day's run on a changed corpus (docs/scheduled-runs.md).

Day 1: a fresh run on the bench corpus. Day 2: 1% of the documents edited (a sentence added
in the middle), 0.5% removed, 1% added; `run --sync` on the same output. Both on a
zero-latency sandbox with default settings; against a fresh run on 2,000 documents for memory.
Then the checks a reader cares about, on the whole current view: no stale vectors (edited
documents serve exactly their new chunks, unchanged ones the chunks they had), no document
mixing versions, nothing removed served, no text billed twice, every input row once.
"""
from __future__ import annotations

import collections
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.settings.config import default_settings_text, parse_settings
from service.sandbox.store import read_ledger
from service.tokenizer import get_encoding
from tests.bench.corpus import SCHEMA, make_documents
from tests.bench.report import table
from transforms.read.split import SplitConfig, Splitter

EDITED, REMOVED, ADDED = 0.01, 0.005, 0.01


def next_day(docs: list[dict], seed: int = 7) -> tuple[list[dict], dict[str, set]]:
    rng = np.random.default_rng(seed)
    n = len(docs)
    picked = rng.permutation(n)
    edited = {docs[i]["id"] for i in picked[:int(n * EDITED)]}
    removed = {docs[i]["id"] for i in picked[int(n * EDITED):int(n * (EDITED + REMOVED))]}
    day2 = []
    for d in docs:
        if d["id"] in removed:
            continue
        if d["id"] in edited:
            middle = len(d["text"]) // 2
            d = {**d, "text": d["text"][:middle] + " (Edited on day two.) " + d["text"][middle:]}
        day2.append(d)
    added = [{**d, "id": f"new-{i:06d}"} for i, d in enumerate(make_documents(int(n * ADDED), seed=seed))]
    return day2 + added, {"edited": edited, "removed": removed, "added": {d["id"] for d in added}}


def _served(out: Path) -> dict[str, list]:
    """doc_id -> [(chunk_index, chunk_count, text_sha256)] of the current view, as a glob reader sees it."""
    rows: dict[str, list] = collections.defaultdict(list)
    for f in sorted((out / "current").glob("embeddings-*.parquet")):
        t = pq.read_table(f, columns=["doc_id", "chunk_index", "chunk_count", "text_sha256"])
        for doc, index, count, sha in zip(*(t.column(c).to_pylist() for c in t.column_names), strict=True):
            rows[doc].append((index, count, sha))
    return rows


def check(out: Path, day1: dict[str, list], day2: list[dict], changed: dict[str, set], model, db: Path) -> dict:
    """The reader's checks on the whole view (counts of what is wrong: all should be 0)."""
    split = parse_settings(default_settings_text()).split
    splitter = Splitter(get_encoding(), SplitConfig(max_tokens=model.chunk_tokens, overlap_tokens=split.overlap_tokens,
                                                    boundary_window=split.boundary_window))
    served = _served(out)
    mixed = sum(1 for rows in served.values()
                if len({c for _, c, _ in rows}) != 1 or sorted(i for i, _, _ in rows) != list(range(rows[0][1])))
    stale = 0
    for d in day2:
        rows = served.get(d["id"], [])
        if d["id"] in changed["edited"] or d["id"] in changed["added"]:
            want = sorted(c.text_sha256 for c in splitter.split(d["id"], d["text"]))
        else:
            want = sorted(sha for _, _, sha in day1[d["id"]])
        stale += sorted(sha for _, _, sha in rows) != want
    sent = collections.Counter(h for charge in read_ledger(str(db)) for h in charge["input_sha256"])
    return {"stale": stale, "mixed": mixed, "removed served": len(changed["removed"] & set(served)),
            "billed twice": sum(1 for n in sent.values() if n > 1),
            "rows not served once": len({d["id"] for d in day2} ^ set(served))}


def run(bench, docs: int) -> None:
    work = bench.work / "sync"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    small = work / "small.parquet"
    pq.write_table(pa.Table.from_pylist(make_documents(2000), schema=SCHEMA), small)
    day1 = make_documents(docs)
    corpus, out = work / "corpus.parquet", work / "out"
    pq.write_table(pa.Table.from_pylist(day1, schema=SCHEMA), corpus, row_group_size=2000, compression="zstd")
    with bench.sandbox("sandbox-sync-2k", []) as sb:   # its own ledger: the same texts as day 1's first
        m_small, _, _ = bench.pipeline("sync-fresh-2k", small, sb, None, 1)
    with bench.sandbox("sandbox-sync", []) as sb:
        m_fresh, s_fresh, _ = bench.pipeline("sync-day1", corpus, sb, None, 1, keep=True, output=out)
        served1 = _served(out)
        day2, changed = next_day(day1)
        pq.write_table(pa.Table.from_pylist(day2, schema=SCHEMA), corpus, row_group_size=2000, compression="zstd")
        m_sync, s_sync, _ = bench.pipeline("sync-day2", corpus, sb, None, 1, keep=True, output=out,
                                           extra=("--sync",))
        wrong = check(out, served1, day2, changed, bench.model, Path(sb.db))
    bench.sync_figures = {"docs": docs, "wall_s": m_sync.wall_s, "peak_rss_mb": m_sync.peak_rss_mb}   # switch.py's
    rows = [["fresh, 2,000 documents", m_small.wall_s, m_small.peak_rss_mb, "", ""],
            [f"day 1: fresh, {docs:,} documents", m_fresh.wall_s, m_fresh.peak_rss_mb, s_fresh["requests"],
             s_fresh["cost_rub"]],
            ["day 2: --sync (" + ", ".join(f"{k} {v:,}" for k, v in s_sync["changes"].items()) + ")",
             m_sync.wall_s, m_sync.peak_rss_mb, s_sync["requests"], s_sync["cost_rub"]]]
    bench.emit(table(["run", "wall s", "peak RSS MB", "requests", "RUB"], rows,
                     f"Scheduled runs: {docs:,} documents, day 2 with {EDITED:.1%} edited, {REMOVED:.1%} removed, "
                     f"{ADDED:.1%} added; zero-latency sandbox, default settings. Day 2 wall / day 1: "
                     f"{m_sync.wall_s / m_fresh.wall_s:.2f} (target <= 0.20); day 2 peak RSS / fresh 2k: "
                     f"{m_sync.peak_rss_mb / m_small.peak_rss_mb:.2f} (target <= 1.5)"))
    bench.emit(table(["on the whole current view after day 2", "count (all 0)"], list(wrong.items())))
    (work / "checks.json").write_text(json.dumps({**wrong, "changes": s_sync["changes"]}))
    shutil.rmtree(work, ignore_errors=True)

