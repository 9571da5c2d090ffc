"""The passage beside its vector: every embeddings row carries the exact text that was sent for
it, in a fresh run, after a view written before rows carried it (tests/e2e/data/, made by the
code of that time), with chunks sized for search in any script, and left out on request."""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from pipeline.cli import main
from tests.conftest import SANDBOX_KEY
from tests.e2e.helpers import assert_passages, current_rows, ledger, summary

DATA = Path(__file__).parent / "data"
MODEL = "text-embedding-3-small"
SCRIPTS = {
    "ru": "Данные идут в вектор, бюджет ограничивает запрос. " * 30,
    "zh": "向量数据库保存每个段落的文本。搜索时显示段落，而不是重新读取语料库" * 20,   # no space at all
    "emoji": "Weather 🌦️ then 🌈, a family 👨‍👩‍👧‍👦 on a walk; " * 25,
    "ja": "検索は段落を示す" * 60,
    "word": "Pneumonoultramicroscopicsilicovolcanoconiosis" * 40,   # one word: cut between tokens
    "mixed": "\n\n".join(f"Paragraph {i}. Данные {i}! 数据{i}。 🙂 end." for i in range(40)),
}


@pytest.fixture
def env_key(monkeypatch):
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)


def write(path: Path, docs: dict[str, str]) -> Path:
    pq.write_table(pa.table({"id": list(docs), "text": list(docs.values())}), path)
    return path


def run(corpus: Path | None, out: Path, sb, *extra: str, models: Path | None = None) -> int:
    argv = ["run", "--output", str(out), "--model", MODEL, "--base-url", sb.base_url, *extra]
    argv += ["--input", str(corpus)] if corpus else []
    return main(argv + (["--models-config", str(models)] if models else []))


def test_passages_of_any_script_are_slices_of_their_document_cut_at_token_boundaries(tmp_path, sandbox, env_key):
    corpus, out = write(tmp_path / "corpus.parquet", SCRIPTS), tmp_path / "out"
    assert run(corpus, out, sandbox, "--chunk-tokens", "40") == 0
    rows = current_rows(out, "embeddings")
    assert assert_passages(out, SCRIPTS) == len(rows) > 6 * 10
    assert all(r["n_tokens"] <= 40 for r in rows)
    assert summary(out)["current"]["without_text"] == 0
    # what the service billed is what the rows carry
    assert {h for c in ledger(sandbox.db) for h in c["input_sha256"]} == {r["text_sha256"] for r in rows}


def test_overlapping_passages_are_slices_too(tmp_path, sandbox, env_key):
    corpus, out = write(tmp_path / "corpus.parquet", SCRIPTS), tmp_path / "out"
    assert run(corpus, out, sandbox, "--chunk-tokens", "40", "--overlap-tokens", "10") == 0
    assert assert_passages(out, SCRIPTS, overlap=True) > 0


def test_no_chunk_text_leaves_it_out_and_a_later_run_puts_it_back_paying_nothing(tmp_path, sandbox, env_key,
                                                                                  caplog):
    corpus, out = write(tmp_path / "corpus.parquet", SCRIPTS), tmp_path / "out"
    assert run(corpus, out, sandbox, "--chunk-tokens", "40", "--no-chunk-text") == 0
    files = [out / f for f in summary(out)["files"] if "embeddings-" in f]
    assert files and all("text" not in pq.read_schema(f).names for f in files)
    rows = sum(pq.read_metadata(f).num_rows for f in files)
    assert summary(out)["current"]["without_text"] == rows
    paid = len(ledger(sandbox.db))
    caplog.set_level(logging.INFO, logger="embedpipe")
    assert run(corpus, out, sandbox, "--chunk-tokens", "40", "--sync") == 0   # output.chunk_text: true
    assert len(ledger(sandbox.db)) == paid
    s = summary(out)
    assert s["changes"]["rewritten"] == len(SCRIPTS) == s["changes"]["unchanged"]
    assert s["current"]["without_text"] == 0 and assert_passages(out, SCRIPTS) == rows
    assert s["requests"] == 0 and s["reused"] == s["embedded"] == rows   # no vector paid again
    assert f"gave {rows:,} rows of {len(SCRIPTS)} unchanged documents their text, their vectors reused (rows " \
           "written with --no-chunk-text" in caplog.text
    # a part without it: those rows' text is null, in the same schema as the others
    part = write(tmp_path / "part.parquet", {d: SCRIPTS[d] for d in ("zh", "ru")})
    assert run(part, out, sandbox, "--chunk-tokens", "40", "--resume", "--no-chunk-text") == 0
    schemas = {tuple(pq.read_schema(f).names) for f in (out / "current").glob("embeddings-*.parquet")}
    assert len(schemas) == 1 and "text" in next(iter(schemas))
    emb = current_rows(out, "embeddings")
    assert {r["doc_id"] for r in emb if r["text"] is None} == {"zh", "ru"}
    assert summary(out)["current"]["without_text"] == sum(r["text"] is None for r in emb)
    # and out of every row: null in every row (the column stays, one schema, once some rows had it)
    caplog.clear()
    assert run(corpus, out, sandbox, "--chunk-tokens", "40", "--sync", "--no-chunk-text") == 0
    assert len(ledger(sandbox.db)) == paid and summary(out)["current"]["without_text"] == rows
    assert "their vectors reused (--no-chunk-text)" in caplog.text
    schemas = {tuple(pq.read_schema(f).names) for f in (out / "current").glob("embeddings-*.parquet")}
    assert len(schemas) == 1 and all(r["text"] is None for r in current_rows(out, "embeddings"))


def test_a_config_without_chunk_text(tmp_path, sandbox, env_key):
    config = tmp_path / "pipeline.yaml"
    config.write_text("output:\n  chunk_text: false\n")
    corpus, out = write(tmp_path / "corpus.parquet", {"a": "one text", "b": "another"}), tmp_path / "out"
    assert run(corpus, out, sandbox, "--run-config", str(config)) == 0
    assert all("text" not in row for row in current_rows(out, "embeddings"))


def before_text(tmp_path: Path) -> tuple[Path, Path, Path, dict[str, str]]:
    """A copy of the DIR made before rows carried their text: (DIR, corpus, models, id -> text)."""
    out = tmp_path / "out"
    shutil.copytree(DATA / "dir_before_text", out, symlinks=True)
    corpus = DATA / "before_text_corpus.parquet"
    table = pq.read_table(corpus)
    return out, corpus, DATA / "before_text_models.yaml", dict(zip(*table.select(["id", "text"]).to_pydict().values(),
                                                                  strict=True))


def old_shas(out: Path) -> set[str]:
    return {r["text_sha256"] for f in out.glob("history/*/embeddings-*.parquet")
            for r in pq.read_table(f, columns=["text_sha256"]).to_pylist()}


def test_a_view_written_before_rows_carried_their_text_gets_it_from_the_next_run_that_reads_it(
        tmp_path, sandbox_factory, env_key, caplog):
    out, corpus, models, docs = before_text(tmp_path)
    sb = sandbox_factory(key=SANDBOX_KEY, balance=100.0, args=["--models", str(models)])
    paid_before = old_shas(out)
    rows_before = {(r["doc_id"], r["chunk_index"], r["token_start"]) for r in current_rows(out, "embeddings")}
    assert rows_before and all(r.get("text") is None for r in current_rows(out, "embeddings"))
    caplog.set_level(logging.INFO, logger="embedpipe")
    # a part of the corpus, two documents it had complete: their rows get their text, paying
    # nothing; the others' rows keep it null, counted
    table, part = pq.read_table(corpus), tmp_path / "part.parquet"
    pq.write_table(table.filter(pc.is_in(table.column("id"), value_set=pa.array(["en-long", "short"]))), part)
    assert run(part, out, sb, "--resume", "--keep-columns", "lang", models=models) == 0
    assert ledger(sb.db) == []
    emb = current_rows(out, "embeddings")
    assert {r["doc_id"] for r in emb if r.get("text") is not None} == {"en-long", "short"}
    # one schema in the view, whatever engine reads its glob: the rows without text have it null
    assert {tuple(pq.read_schema(f).names) for f in (out / "current").glob("embeddings-*.parquet")} == {
        tuple(pq.read_schema(next((out / "current").glob("embeddings-*.parquet"))).names)}
    assert "text" in pq.read_schema(next((out / "current").glob("embeddings-*.parquet"))).names
    assert summary(out)["current"]["without_text"] == sum(1 for r in emb if r.get("text") is None) > 0
    assert summary(out)["changes"]["rewritten"] == 2
    assert "gave 7 rows of 2 unchanged documents their text" in caplog.text
    # the whole corpus: every row has its text; only what was pending is paid, nothing known again
    assert run(corpus, out, sb, "--sync", "--keep-columns", "lang", models=models) == 0
    s = summary(out)
    assert s["current"]["without_text"] == 0 and s["pending"] == 0
    assert_passages(out, docs)
    charged = [h for c in ledger(sb.db) for h in c["input_sha256"]]
    assert charged and not set(charged) & paid_before and len(charged) == len(set(charged))
    assert rows_before <= {(r["doc_id"], r["chunk_index"], r["token_start"]) for r in current_rows(out, "embeddings")}


def test_resume_without_input_on_a_view_written_before_sends_its_pending_rows_with_their_text(
        tmp_path, sandbox_factory, env_key):
    out, _, models, docs = before_text(tmp_path)
    sb = sandbox_factory(key=SANDBOX_KEY, balance=100.0, args=["--models", str(models)])
    pending = {(r["doc_id"], r["chunk_index"], r["token_start"]) for r in current_rows(out, "pending")}
    assert pending
    assert run(None, out, sb, "--resume", models=models) == 0
    sent = [r for r in current_rows(out, "embeddings") if (r["doc_id"], r["chunk_index"], r["token_start"]) in pending]
    assert len(sent) == len(pending) and all(r["text"] and docs[r["doc_id"]].find(r["text"]) >= 0 for r in sent)
