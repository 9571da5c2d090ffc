"""A real partial run writes every output file kind with the guaranteed columns required and
non-nullable vector elements, down to the Parquet schema that DuckDB and ClickHouse read; and
`--resume`, `--known` and `report` still read directories written before that change."""
from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.cli import main
from service.sandbox.launcher import SandboxProcess
from tests.conftest import SANDBOX_KEY
from tests.e2e.helpers import corpus_rows, write_corpus
from tests.e2e.money_helpers import MODEL, billed_twice, current, ledger, run, summary, write_models
from tests.unit.test_output_schemas import NULLABLE, assert_declared

KINDS = ("embeddings", "requests", "failed", "pending", "documents")
KEPT = (pa.field("lang", pa.string()),)

# The schemas as written before the columns were declared required: every column nullable,
# vector elements too. A fixture on purpose: it must not follow transforms/schemas.py.
_OLD_CHUNK = [("doc_id", pa.string()), ("chunk_index", pa.int32()), ("chunk_count", pa.int32()),
              ("token_start", pa.int32()), ("token_end", pa.int32()), ("n_tokens", pa.int32()),
              ("text_sha256", pa.string()), ("model", pa.string())]
_UTC = pa.timestamp("us", tz="UTC")


def old_schema(kind: str, dims: int) -> pa.Schema:
    return pa.schema({
        "embeddings": [*_OLD_CHUNK, ("embedding", pa.list_(pa.float32(), dims)), ("request_id", pa.string()),
                       ("cost_rub", pa.float64()), ("run_id", pa.string()), ("embedded_at", _UTC),
                       ("lang", pa.string())],
        "pending": [*_OLD_CHUNK, ("text", pa.string()), ("reason", pa.string()), ("run_id", pa.string()),
                    ("lang", pa.string())],
        "requests": [("request_id", pa.string()), ("model", pa.string()), ("n_inputs", pa.int32()),
                     ("prompt_tokens", pa.int64()), ("total_tokens", pa.int64()), ("cost_rub", pa.float64()),
                     ("balance_after", pa.float64()), ("attempts", pa.int32()), ("latency_ms", pa.float64()),
                     ("status", pa.int32()), ("started_at", _UTC), ("run_id", pa.string())],
        "failed": [("doc_id", pa.string()), ("chunk_index", pa.int32()), ("reason", pa.string()),
                   ("detail", pa.string()), ("run_id", pa.string())],
        "documents": [("doc_id", pa.string()), ("chunk_count", pa.int32()), ("n_tokens", pa.int64()),
                      ("model", pa.string()), ("embedding", pa.list_(pa.float32(), dims)), ("run_id", pa.string())],
    }[kind])


@pytest.fixture(scope="module")
def partial(tmp_path_factory):
    """A run stopped by its cap: embeddings, requests, failed, pending and documents files."""
    tmp = tmp_path_factory.mktemp("schemas")
    models = write_models(tmp / "models.yaml")
    corpus = write_corpus(tmp / "corpus.parquet")
    with pytest.MonkeyPatch.context() as mp, SandboxProcess(
            tmp / "sandbox.db", key=SANDBOX_KEY, balance=100.0, args=["--models", str(models)]) as sb:
        mp.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
        out = tmp / "out"
        assert run(corpus, out, sb, models, "--keep-columns", "lang", "--doc-vectors",
                   "--max-spend-rub", "0.5", "--allow-partial") == 4
        yield out, corpus, models, sb, len(ledger(sb))


def files(out, kind: str) -> list:
    """Every file of KIND in DIR: what runs wrote (history) and what commits derived (segments)."""
    return sorted([*out.glob(f"history/*/{kind}-*.parquet"), *out.glob(f"_segments/{kind}-*.parquet")])


def test_every_file_kind_declares_its_guaranteed_columns_required(partial):
    out = partial[0]
    for kind in KINDS:
        assert files(out, kind), f"the partial run wrote no {kind} file"
        for path in files(out, kind):
            assert_declared(kind, pq.read_schema(path), KEPT if kind in ("embeddings", "pending") else ())
            # what engines that ignore the stored Arrow schema see: 0 = required, and a vector of
            # required elements in a required list has exactly one level, the repetition
            parquet = pq.ParquetFile(path).schema
            for i in range(len(parquet)):
                column = parquet.column(i)
                top = column.path.split(".")[0]
                may_be_null = top == "lang" or top in NULLABLE.get(kind, ())
                expected = 1 if top == "embedding" else int(may_be_null)
                assert column.max_definition_level == expected, f"{path.name}: {column.path}"


def rewrite_as_before(src, dst):
    """A copy of SRC as the pipeline wrote it before: the same rows in the old, nullable schemas
    (no text in the embeddings rows, manifests that do not list the files without it)."""
    shutil.copytree(src, dst, symlinks=True)   # `current` stays a link into the copy
    dims = pq.read_schema(files(dst, "embeddings")[0]).field("embedding").type.list_size
    for kind in KINDS:
        for path in files(dst, kind):
            table = pq.read_table(path)
            old = old_schema(kind, dims).with_metadata(table.schema.metadata)
            pq.write_table(table.select(old.names).cast(old), path)
            assert all(f.nullable for f in pq.read_schema(path))
    for manifest in [dst / "_current.json", *dst.glob("_views/*.json")]:
        doc = json.loads(manifest.read_text())
        manifest.write_text(json.dumps({k: v for k, v in doc.items() if k not in ("chunking", "textless")}))
    return dst


def assert_all_delivered(out) -> None:
    """Every chunk of every embeddable row is in the current embeddings once, old files or new."""
    rows = current(out, "embeddings").to_pylist()
    keys = [(r["doc_id"], r["chunk_index"], r["token_start"]) for r in rows]
    assert len(keys) == len(set(keys))
    chunks = {r["doc_id"]: (r["chunk_count"], set()) for r in rows}
    for r in rows:
        chunks[r["doc_id"]][1].add(r["chunk_index"])
    assert all(indexes == set(range(count)) for count, indexes in chunks.values())
    failed = {r["doc_id"] for r in current(out, "failed").to_pylist()}
    assert set(chunks) == {r["id"] for r in corpus_rows()} - failed


def test_resume_and_report_read_a_directory_written_before(partial, tmp_path, capsys):
    out, corpus, models, sb, first_run = partial
    old = rewrite_as_before(out, tmp_path / "old")
    paid_before = len(ledger(sb))  # other tests resume copies of the same run on this sandbox
    assert run(corpus, old, sb, models, "--keep-columns", "lang", "--resume") == 0
    charges = ledger(sb)
    assert billed_twice(charges[:first_run] + charges[paid_before:]) == {}
    assert current(old, "pending").num_rows == 0
    assert_all_delivered(old)
    assert main(["report", str(old)]) == 0
    assert MODEL in capsys.readouterr().out


def test_resume_without_input_sends_old_pending_rows(partial, tmp_path):
    out, _, models, sb, _ = partial
    old = rewrite_as_before(out, tmp_path / "old")
    pending = {(r["doc_id"], r["chunk_index"], r["token_start"]) for r in current(old, "pending").to_pylist()}
    assert main(["run", "--output", str(old), "--model", MODEL, "--base-url", sb.base_url,
                 "--models-config", str(models), "--resume"]) == 0
    delivered = {(r["doc_id"], r["chunk_index"], r["token_start"]) for r in current(old, "embeddings").to_pylist()}
    assert pending and pending <= delivered and summary(old)["pending"] == 0


def test_known_reuses_vectors_from_files_written_before(partial, tmp_path):
    out, corpus, models, sb, _ = partial
    old = rewrite_as_before(out, tmp_path / "old")
    known_shas = set(current(old, "embeddings").column("text_sha256").to_pylist())
    paid_before = len(ledger(sb))
    assert run(corpus, tmp_path / "new", sb, models, "--known", str(old / "current" / "embeddings-*.parquet")) == 0
    new_charges = ledger(sb)[paid_before:]
    assert new_charges and not {h for c in new_charges for h in c["input_sha256"]} & known_shas
