"""A scheduled run on a corpus that changes (docs/scheduled-runs.md):
one output directory whose current view is exact after each run, never mixes two versions of
a document, and pays for no text twice; the rest of the history stays."""
from __future__ import annotations

import json
import os
import random
import shutil
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.cli import main
from pipeline.settings.config import default_settings_text, parse_settings
from service.catalog import parse_models
from service.tokenizer import get_encoding
from tests.conftest import SANDBOX_KEY
from tests.e2e.helpers import WORDS_EN, WORDS_RU, assert_passages, paragraph
from tests.e2e.money_helpers import (MODEL, assert_every_row_once, billed_twice, corpus_rows, current,
                                     kill_once_journaled, ledger, micro, run, start_sandbox, summary, write_corpus,
                                     write_models)
from transforms.read.split import SplitConfig, Splitter


@pytest.fixture
def env_key(monkeypatch):
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)


def next_day(rows: list[dict], seed: int = 7, edit_short: int = 6, edit_long: int = 2, remove: int = 4,
             add: int = 5) -> tuple[list[dict], dict]:
    """ROWS a day later: short documents rewritten, long ones with one paragraph rewritten
    (their other chunks unchanged), documents removed and added. (rows, what changed by id)."""
    rng = random.Random(seed)
    rows = [dict(r) for r in rows]
    short = [r for r in rows if r["id"].startswith("s-")]
    long = [r for r in rows if r["id"].startswith("l-")]
    changed = {"edited": set(), "removed": set(), "added": set()}
    for r in rng.sample(short, edit_short):
        r["text"] = paragraph(rng, WORDS_EN + WORDS_RU, rng.randint(8, 40))
        changed["edited"].add(r["id"])
    for r in rng.sample(long, edit_long):
        paragraphs = r["text"].split("\n\n")
        paragraphs[len(paragraphs) // 2] = paragraph(rng, WORDS_RU, 120)
        r["text"] = "\n\n".join(paragraphs)
        changed["edited"].add(r["id"])
    for r in rng.sample([r for r in short + long if r["id"] not in changed["edited"]], remove):
        rows.remove(r)
        changed["removed"].add(r["id"])
    for i in range(add):
        rows.append({"id": f"new-{seed}-{i}", "text": paragraph(rng, WORDS_EN, rng.randint(8, 40))})
        changed["added"].add(f"new-{seed}-{i}")
    return rows, changed


def chunk_hashes(models: Path, rows: list[dict]) -> dict[str, set]:
    """Every document's chunk texts (sha256) as the job splits its current text."""
    spec, split = parse_models(models.read_text())[MODEL], parse_settings(default_settings_text()).split
    splitter = Splitter(get_encoding(), SplitConfig(max_tokens=spec.chunk_tokens, overlap_tokens=split.overlap_tokens,
                                                    boundary_window=split.boundary_window))
    return {r["id"]: {c.text_sha256 for c in splitter.split(r["id"], r["text"])}
            for r in rows if r["text"] and r["text"].strip()}


def assert_current(out: Path, models: Path, rows: list[dict]) -> None:
    """DIR's current view is exactly ROWS: every row once (nothing removed still served), and
    every document's vectors are those of its current text, all of them (nothing stale or mixed)."""
    assert_every_row_once(out, rows)
    assert_passages(out, {r["id"]: r["text"] for r in rows})
    served: dict[str, set] = {}
    for r in current(out, "embeddings").to_pylist():
        served.setdefault(r["doc_id"], set()).add(r["text_sha256"])
    assert served == chunk_hashes(models, rows)


def glob_rows(out: Path) -> pa.Table:
    """What a glob reader gets (docs/outputs.md): every embeddings file under DIR/current/."""
    files = sorted((out / "current").glob("embeddings-*.parquet"))
    return pa.concat_tables([pq.read_table(f, columns=["doc_id", "chunk_index", "chunk_count", "token_start",
                                                         "text_sha256"]) for f in files])


def day_one(tmp_path: Path, sandbox_factory, n_short: int, n_long: int):
    """A first run on a fresh corpus: (models, sandbox, corpus path, output dir, its rows)."""
    models = write_models(tmp_path / "models.yaml")
    sb = start_sandbox(sandbox_factory, models)
    rows = corpus_rows(n_short=n_short, n_long=n_long)
    corpus, out = write_corpus(tmp_path / "corpus.parquet", rows), tmp_path / "out"
    assert run(corpus, out, sb, models) == 0
    return models, sb, corpus, out, rows


def plan_json(corpus: Path, out: Path, sb, models: Path, *extra: str, capsys) -> dict:
    capsys.readouterr()
    main(["plan", "--input", str(corpus), "--output", str(out), "--model", MODEL, "--base-url", sb.base_url,
          "--models-config", str(models), "--json", *extra])
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("workers", [(), pytest.param(("--direct_num_workers", "2", "--direct_running_mode",
                                                         "multi_processing"), marks=pytest.mark.soak)],
                         ids=["one-process", "two-processes"])
def test_a_changed_corpus_makes_the_current_view_exact_and_pays_only_what_changed(tmp_path, sandbox_factory,
                                                                                 env_key, capsys, workers):
    models, sb, corpus, out, day1 = day_one(tmp_path, sandbox_factory, 80, 6)
    first = ledger(sb)
    day2, changed = next_day(day1)
    write_corpus(corpus, day2)

    planned = plan_json(corpus, out, sb, models, "--sync", *workers, capsys=capsys)
    assert run(corpus, out, sb, models, "--sync", *workers) == 0
    charges = ledger(sb)
    assert billed_twice(charges) == {}
    assert_current(out, models, day2)
    # only texts DIR holds nowhere were paid: the unchanged chunks of the edited long documents not
    old = set().union(*chunk_hashes(models, day1).values())
    new_texts = set().union(*chunk_hashes(models, day2).values()) - old
    assert {h for c in charges[len(first):] for h in c["input_sha256"]} == new_texts
    s = summary(out)
    unchanged = len({r["id"] for r in day2}) - len(changed["edited"]) - len(changed["added"])
    assert s["changes"] == {"added": len(changed["added"]), "edited": len(changed["edited"]),
                            "removed": len(changed["removed"]), "unchanged": unchanged, "resumed": 0}
    assert planned["changes"] == s["changes"]
    assert planned["estimated_cost_rub"] == pytest.approx(micro(c["cost_rub"] for c in charges[len(first):]) / 1e6,
                                                           rel=0.02)
    emb = current(out, "embeddings")
    assert s["current"]["embedded"] == emb.num_rows and s["current"]["pending"] == 0
    assert s["current"]["documents"] == len({r["id"] for r in day2})
    # a glob reader sees the same rows as summary.json's files
    assert sorted(glob_rows(out).column("text_sha256").to_pylist()) == sorted(emb.column("text_sha256").to_pylist())
    # the history keeps every row ever paid: it reconciles with the ledger to the micro-rouble
    recon = s["reconciliation"]
    assert recon["rows_minus_requests_rub"] == 0 and recon["balance_minus_requests_rub"] == 0
    assert micro([recon["rows_cost_rub"]]) == micro(c["cost_rub"] for c in charges)

    # the same corpus again: nothing sent, nothing rewritten
    files = s["files"]
    assert run(corpus, out, sb, models, "--sync", *workers) == 0
    assert ledger(sb) == charges and summary(out)["changes"]["unchanged"] == len({r["id"] for r in day2})
    assert summary(out)["files"] == files
    assert_current(out, models, day2)


def test_resume_brings_a_part_up_to_date_and_sync_makes_the_view_exactly_the_input(tmp_path, sandbox_factory,
                                                                                  env_key, caplog):
    models, sb, corpus, out, day1 = day_one(tmp_path, sandbox_factory, 30, 2)
    day2, changed = next_day(day1, edit_short=3, edit_long=1, remove=2, add=2)
    part = [r for r in day2 if r["id"] in changed["edited"] | changed["added"]]
    assert run(write_corpus(tmp_path / "part.parquet", part), out, sb, models, "--resume") == 0
    assert "stay current" in caplog.text and "--sync" in caplog.text
    kept = [r for r in day1 if r["id"] not in {p["id"] for p in part}]
    assert_current(out, models, kept + part)   # the others stay as they were
    assert run(write_corpus(corpus, day2), out, sb, models, "--sync") == 0
    assert summary(out)["changes"]["removed"] == len(changed["removed"])
    assert_current(out, models, day2)
    assert billed_twice(ledger(sb)) == {}
    # a plain run into a directory that holds results is refused, and says which flag to pass
    caplog.clear()
    assert run(corpus, out, sb, models) == 2
    assert "--sync" in caplog.text and "--resume" in caplog.text


def rewrite_long(rows: list[dict], doc_id: str, seed: int) -> list[dict]:
    rng = random.Random(seed)
    text = "\n\n".join(paragraph(rng, WORDS_RU, 120) for _ in range(12))
    return [{**r, "text": text} if r["id"] == doc_id else r for r in rows]


def test_a_stop_half_way_keeps_serving_the_complete_old_version(tmp_path, sandbox_factory, env_key, capsys):
    """The budget runs out with an edited document half embedded again: readers keep its old
    vectors, all of them; the pending rows say what is left; the next run completes it and the
    old vectors leave, with nothing paid twice."""
    models, sb, corpus, out, day1 = day_one(tmp_path, sandbox_factory, 20, 2)
    old_rows = {r["text_sha256"] for r in current(out, "embeddings").to_pylist() if r["doc_id"] == "l-0"}
    day2 = rewrite_long(day1, "l-0", seed=11)
    write_corpus(corpus, day2)
    estimate = plan_json(corpus, out, sb, models, "--sync", capsys=capsys)["estimated_cost_rub"]
    assert run(corpus, out, sb, models, "--sync", "--max-spend-rub", f"{estimate / 2:.6f}", "--allow-partial") == 4
    s = summary(out)
    assert s["current"]["staged"] > 0, "some new chunks were paid and wait for the others"
    served = [r for r in current(out, "embeddings").to_pylist() if r["doc_id"] == "l-0"]
    assert {r["text_sha256"] for r in served} == old_rows      # the complete old version, nothing of the new
    assert {r["text_sha256"] for r in glob_rows(out).to_pylist() if r["doc_id"] == "l-0"} == old_rows
    new = chunk_hashes(models, day2)["l-0"]
    left = {r["text_sha256"] for r in current(out, "pending").to_pylist() if r["doc_id"] == "l-0"}
    assert left and left < new and s["pending_reasons"] == {"budget_exhausted": len(left)}

    assert run(corpus, out, sb, models, "--sync") == 0
    assert billed_twice(ledger(sb)) == {}
    assert summary(out)["changes"]["resumed"] == 1 and summary(out)["current"]["staged"] == 0
    assert_current(out, models, day2)
    # the staged rows were promoted: every new chunk is served with the request that paid for it
    paid = {c["request_id"] for c in ledger(sb)}
    assert all(r["request_id"] in paid and r["cost_rub"] > 0 for r in current(out, "embeddings").to_pylist()
               if r["doc_id"] == "l-0")


def test_an_edited_document_the_service_refuses_is_a_dead_letter(tmp_path, sandbox_factory, env_key):
    models, sb, corpus, out, day1 = day_one(tmp_path, sandbox_factory, 10, 0)
    sb.stop()
    # the same account, now counting every text 1000 times longer: the new text cannot fit
    strict = start_sandbox(sandbox_factory, models, db=sb.db, args=["--token-skew", f"{MODEL}=1000"])
    day2 = [{**r, "text": "a new text the service will not take"} if r["id"] == "s-3" else r for r in day1]
    assert run(write_corpus(corpus, day2), out, strict, models, "--sync") == 0
    failed = [r for r in current(out, "failed").to_pylist() if r["doc_id"] == "s-3"]
    assert failed and {r["reason"] for r in failed} == {"too_long"}
    assert not [r for r in current(out, "embeddings").to_pylist() if r["doc_id"] == "s-3"]
    assert summary(out)["changes"]["edited"] == 1 and summary(out)["requests"] > 0


def test_a_run_killed_mid_way_leaves_the_last_view_and_the_next_pays_nothing_twice(tmp_path, sandbox_factory,
                                                                                   env_key):
    models, sb, corpus, out, day1 = day_one(tmp_path, sandbox_factory, 60, 2)
    before = sorted(glob_rows(out).column("text_sha256").to_pylist())
    view = os.readlink(out / "current")
    day2, _ = next_day(day1, edit_short=40, edit_long=1, remove=3, add=10)
    write_corpus(corpus, day2)
    sb.stop()
    slow = start_sandbox(sandbox_factory, models, db=sb.db, args=["--latency-ms", "300"])
    kill_once_journaled(corpus, out, slow, models, tmp_path / "job.log", 2, "--sync")
    assert os.readlink(out / "current") == view
    assert sorted(glob_rows(out).column("text_sha256").to_pylist()) == before   # the last complete view
    fast = start_sandbox(sandbox_factory, models, db=sb.db)
    assert run(corpus, out, fast, models, "--sync") == 0
    charges = ledger(fast)
    assert len(charges) > 2 and billed_twice(charges) == {}
    assert_current(out, models, day2)


def test_a_reader_sees_one_complete_view_while_runs_commit(tmp_path, sandbox_factory, env_key):
    """A reader globbing DIR/current/ while runs switch between two corpora: every read it
    completes is one whole view, no row twice, no document half of one version."""
    models = write_models(tmp_path / "models.yaml")
    sb = start_sandbox(sandbox_factory, models)
    a = corpus_rows(n_short=40, n_long=3)
    b, _ = next_day(a, edit_short=15, edit_long=2, remove=5, add=8)
    corpus, out = tmp_path / "corpus.parquet", tmp_path / "out"
    assert run(write_corpus(corpus, a), out, sb, models) == 0
    views = [chunk_hashes(models, a), chunk_hashes(models, b)]   # what each complete view serves
    stop, reads, problems = threading.Event(), [0], []

    def reader():
        while not stop.is_set():
            try:
                rows = glob_rows(out).to_pylist()
            except OSError:   # a file of the view was switched away under the reader: read again
                continue
            keys = [(r["doc_id"], r["chunk_index"], r["token_start"]) for r in rows]
            served: dict[str, set] = {}
            for r in rows:
                served.setdefault(r["doc_id"], set()).add(r["text_sha256"])
            if len(keys) != len(set(keys)) or served not in views:
                problems.append(sorted(keys))
            reads[0] += 1

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    try:
        for rows in (b, a, b):
            assert run(write_corpus(corpus, rows), out, sb, models, "--sync") == 0
    finally:
        stop.set()
        thread.join(30)
    assert reads[0] > 3 and problems == []
    assert_current(out, models, b)
    assert billed_twice(ledger(sb)) == {}


def test_pieces_of_a_text_the_service_split_are_not_paid_again_after_a_kill(tmp_path, sandbox_factory, env_key):
    """The service counts 30% more tokens than the catalogue promises: long chunks come back
    over-length and are sent again in pieces. A run killed after paying some pieces; the next
    run sends the chunks whole again, and the pieces already paid are found, not paid."""
    models = write_models(tmp_path / "models.yaml")
    rows = corpus_rows(n_short=0, n_long=6)
    corpus, out = write_corpus(tmp_path / "corpus.parquet", rows), tmp_path / "out"
    slow = start_sandbox(sandbox_factory, models, args=["--token-skew", f"{MODEL}=1.3", "--latency-ms", "300"])
    kill_once_journaled(corpus, out, slow, models, tmp_path / "job.log", 3)
    pieces = {h for c in ledger(slow) for h in c["input_sha256"]} - set().union(*chunk_hashes(models, rows).values())
    assert pieces, "the killed run paid for pieces"
    sb = start_sandbox(sandbox_factory, models, db=slow.db, args=["--token-skew", f"{MODEL}=1.3"])
    assert run(corpus, out, sb, models, "--resume") == 0
    assert billed_twice(ledger(sb)) == {}
    assert_every_row_once(out, rows)
    assert {r["text_sha256"] for r in current(out, "embeddings").to_pylist()} >= pieces


def test_the_view_of_a_document_is_its_own_version_whatever_its_kept_columns(tmp_path, sandbox_factory, env_key):
    """Kept columns belong to a version: a changed value is a new version of the rows, its
    vectors reused at no cost."""
    models = write_models(tmp_path / "models.yaml")
    sb = start_sandbox(sandbox_factory, models)
    rows = [{"id": f"d{i}", "text": f"text number {i} about budgets", "lang": "en"} for i in range(6)]
    corpus, out = tmp_path / "corpus.parquet", tmp_path / "out"
    schema = pa.schema([("id", pa.string()), ("text", pa.string()), ("lang", pa.string())])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), corpus)
    assert run(corpus, out, sb, models, "--keep-columns", "lang") == 0
    paid = ledger(sb)
    rows[2]["lang"] = "ru"
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), corpus)
    assert run(corpus, out, sb, models, "--keep-columns", "lang", "--sync") == 0
    assert ledger(sb) == paid
    assert summary(out)["changes"]["edited"] == 1
    langs = {r["doc_id"]: r["lang"] for r in current(out, "embeddings").to_pylist()}
    assert langs == {f"d{i}": ("ru" if i == 2 else "en") for i in range(6)}



def test_a_directory_of_the_earlier_layout_is_taken_over_without_paying_again(tmp_path, sandbox_factory, env_key):
    """Before the current view, every run's files lay at the top of DIR: the next run moves
    them into the history and reuses every vector there."""
    models = write_models(tmp_path / "models.yaml")
    sb = start_sandbox(sandbox_factory, models)
    rows = corpus_rows(n_short=20, n_long=1)
    corpus, out = write_corpus(tmp_path / "corpus.parquet", rows), tmp_path / "out"
    assert run(corpus, out, sb, models) == 0
    paid = ledger(sb)
    for path in out.glob("history/*/*.parquet"):   # the earlier layout: files at the top, no view
        if not path.name.startswith("changes-"):
            path.rename(out / path.name)
    for name in ("current", "_current.json", "_views", "_segments", "history"):
        target = out / name
        target.unlink() if target.is_symlink() or target.is_file() else shutil.rmtree(target)
    assert run(corpus, out, sb, models, "--resume") == 0
    assert ledger(sb) == paid
    assert not list(out.glob("*.parquet"))
    assert_current(out, models, rows)


def test_a_view_holds_one_model_and_one_schema(tmp_path, sandbox_factory, env_key, caplog):
    """A run that paid nothing (exit 3) leaves pending rows another model may replace; once a
    view holds vectors, another model is refused before spending, and other kept columns
    outside --sync, with the way to adopt them."""
    from tests.e2e.helpers import write_corpus as write_with_lang
    models = write_models(tmp_path / "models.yaml")
    sb = start_sandbox(sandbox_factory, models)
    corpus, out = write_with_lang(tmp_path / "corpus.parquet"), tmp_path / "out"
    assert run(corpus, out, sb, models, "--keep-columns", "lang", "--max-spend-rub", "0.000001") == 3
    assert run(corpus, out, sb, models, "--model", "text-embedding-3-large") == 0
    assert summary(out)["current"]["pending"] == 0 and ledger(sb)
    paid = ledger(sb)
    caplog.clear()
    assert run(corpus, out, sb, models, "--model", "text-embedding-3-large", "--resume", "--keep-columns", "lang") == 2
    assert "--keep-columns" in caplog.text and "--sync" in caplog.text
    caplog.clear()
    assert run(corpus, out, sb, models, "--sync") == 2
    assert "text-embedding-3-large vectors of length 3072" in caplog.text
    assert ledger(sb) == paid
