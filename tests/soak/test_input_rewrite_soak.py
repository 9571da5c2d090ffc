"""Soak: the corpus rewritten while a scheduled `run --sync` reads it, as an upstream job does,
in place and by renaming a new file over it. The sandbox's latency (--latency-ms) slows the
run so that the rewrite lands while its worker is still reading and sending.

    make soak        (pytest -m soak -s: prints the figures)

The run stops with exit 1 and one line naming the file; DIR's current view is still day one's,
every document as day one's file has it; the same command afterwards serves the new file
whole, and the ledger bills no text twice over the three runs.
"""
from __future__ import annotations

import hashlib
import os
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.e2e.money_helpers import (assert_every_row_once, billed_twice, corpus_rows, current,
                                     ledger, micro, run, start_job, start_sandbox, wait_for_journal, write_models)
from transforms.money.apportion import from_micro

pytestmark = pytest.mark.soak

ROW_GROUP = 25      # the worker opens the file again for each row group as it goes
LATENCY_MS = "60"   # ~150 requests of day two at one in flight: ~10 s to rewrite into


def write(path, rows):
    pq.write_table(pa.Table.from_pylist(rows, schema=pa.schema([("id", pa.string()), ("text", pa.string())])),
                   path, row_group_size=ROW_GROUP)
    return path


def edited(rows, mark: str, every: int):
    return [dict(r, text=f"{r['text']} ({mark})") if i % every == 0 else r for i, r in enumerate(rows)]


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def differing(old, new) -> list[str]:
    """The one-chunk documents whose text differs between OLD and NEW."""
    b = {r["id"]: r["text"] for r in new}
    return [r["id"] for r in old if r["id"].startswith("s-") and r["id"] in b and b[r["id"]] != r["text"]]


def served_as(out, rows, ids) -> int:
    """How many of IDS current/ serves with the text ROWS give them."""
    table = current(out, "embeddings")
    served = dict(zip(table.column("doc_id").to_pylist(), table.column("text_sha256").to_pylist(), strict=True))
    text = {r["id"]: r["text"] for r in rows}
    return sum(served.get(d) == sha(text[d]) for d in ids)


@pytest.mark.parametrize("how", ["in_place", "rename"])
def test_a_corpus_rewritten_during_the_run_is_never_served_mixed(tmp_path, sandbox_factory, monkeypatch, how):
    monkeypatch.setenv("EMBEDDINGS_API_KEY", "sk-test-key")
    models = write_models(tmp_path / "models.yaml")
    sandbox = start_sandbox(sandbox_factory, models, args=["--latency-ms", LATENCY_MS])
    corpus, out, log = tmp_path / "corpus.parquet", tmp_path / "out", tmp_path / "day2.log"
    day1 = corpus_rows(n_short=600, n_long=4)
    assert run(write(corpus, day1), out, sandbox, models, "--sync") == 0
    view, day1_requests = current(out, "embeddings"), len(ledger(sandbox))
    day2, rewrite = edited(day1, "day two", 2), edited(day1, "rewritten", 3)
    changed = differing(day1, rewrite)
    assert served_as(out, day1, changed) == len(changed) > 100

    write(corpus, day2)
    started = time.monotonic()
    proc = start_job(corpus, out, sandbox, models, log, "--sync")
    wait_for_journal(proc, out, 10, log)
    if how == "in_place":
        write(corpus, rewrite)
    else:
        os.replace(write(tmp_path / "next.parquet", rewrite), corpus)
    code = proc.wait(300)
    stopped_s = time.monotonic() - started
    text = log.read_text()
    errors = [line for line in text.splitlines() if " ERROR " in line]
    assert code == 1 and len(errors) == 1 and "Traceback" not in text, text
    assert f"the input file {corpus} changed while the run read it" in errors[0]
    assert current(out, "embeddings") == view    # day one's view, untouched
    assert_every_row_once(out, day1)
    assert served_as(out, day1, changed) == len(changed) and not served_as(out, rewrite, changed)
    stopped = ledger(sandbox)[day1_requests:]

    started = time.monotonic()
    assert run(corpus, out, sandbox, models, "--sync") == 0
    again_s = time.monotonic() - started
    assert_every_row_once(out, rewrite)
    assert served_as(out, rewrite, changed) == len(changed) and not served_as(out, day1, changed)
    charges = ledger(sandbox)
    assert not billed_twice(charges)
    print(f"\n{how}: the stopped run: exit {code} after {stopped_s:.1f} s, {len(stopped)} requests, "
          f"{from_micro(micro(c['cost_rub'] for c in stopped)):.6f} RUB; the same command again: exit 0 in "
          f"{again_s:.1f} s, {len(charges) - day1_requests - len(stopped)} requests; texts billed twice over the "
          f"three runs: {len(billed_twice(charges))}; {errors[0][24:]}")
