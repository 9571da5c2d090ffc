"""Cloud paths: the job reads and writes only through Beam's FileSystems.

A `mem://` filesystem registered with Beam stands in for gs:// and s3:// (same object-store
rules as Beam's GCS filesystem: no directories, `exists` only for objects, a recursive delete
needs a trailing '/'). The job runs in this process (FnApiRunner, threads), so its workers see
the same store. Any plain open(), os.path or pathlib use of a user path fails here (the local
disk has no such file) or leaves a stray `mem:` directory in the working directory.
"""
from __future__ import annotations

import hashlib
import io
import json
import threading
import time
from importlib import resources

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.io.filesystem import CompressedFile, CompressionTypes, FileMetadata, FileSystem
from apache_beam.io.filesystems import FileSystems

from pipeline.outdir.layout import kind_of
from tests.conftest import SANDBOX_KEY
from tests.e2e.helpers import corpus_rows, ledger, run

MODEL = "text-embedding-3-small"
PREFIX = "mem://"


class _Store:
    lock = threading.Lock()
    objects: dict[str, tuple[bytes, float]] = {}


class _Upload(io.BytesIO):
    """Like an object-store upload: the object appears, whole, on close."""

    def __init__(self, path: str):
        super().__init__()
        self._path = path

    def close(self):
        if not self.closed:
            with _Store.lock:
                _Store.objects[self._path] = (self.getvalue(), time.time())
        super().close()


class MemFileSystem(FileSystem):
    @classmethod
    def scheme(cls):
        return "mem"

    def join(self, basepath, *paths):
        path = basepath
        for p in paths:
            path = path.rstrip("/") + "/" + p.lstrip("/")
        return path

    def split(self, path):
        head, _, tail = path[len(PREFIX):].rpartition("/")
        return (PREFIX + head, tail) if head else (path, "")

    def mkdirs(self, path):
        pass

    def has_dirs(self):
        return False

    def _list(self, prefix):
        with _Store.lock:
            found = [(p, len(d), t) for p, (d, t) in _Store.objects.items() if p.startswith(prefix)]
        for path, size, updated in found:
            yield FileMetadata(path, size, updated)

    def _open(self, raw, path, compression_type):
        compression_type = self._get_compression_type(path, compression_type)
        return raw if compression_type == CompressionTypes.UNCOMPRESSED else CompressedFile(raw, compression_type)

    def create(self, path, mime_type="application/octet-stream", compression_type=CompressionTypes.AUTO):
        return self._open(_Upload(path), path, compression_type)

    def open(self, path, mime_type="application/octet-stream", compression_type=CompressionTypes.AUTO):
        with _Store.lock:
            if path not in _Store.objects:
                raise FileNotFoundError(path)
            data = _Store.objects[path][0]
        return self._open(io.BytesIO(data), path, compression_type)

    def copy(self, sources, destinations):
        with _Store.lock:
            for src, dst in zip(sources, destinations, strict=True):
                _Store.objects[dst] = _Store.objects[src]

    def rename(self, sources, destinations):
        with _Store.lock:
            for src, dst in zip(sources, destinations, strict=True):
                _Store.objects[dst] = _Store.objects.pop(src)

    def exists(self, path):
        with _Store.lock:
            return path in _Store.objects

    def size(self, path):
        return len(_Store.objects[path][0])

    def last_updated(self, path):
        return _Store.objects[path][1]

    def checksum(self, path):
        return str(hash(_Store.objects[path][0]))

    def metadata(self, path):
        data, updated = _Store.objects[path]
        return FileMetadata(path, len(data), updated)

    def delete(self, paths):
        with _Store.lock:
            for path in paths:
                if path.endswith("/"):
                    for key in [k for k in _Store.objects if k.startswith(path)]:
                        del _Store.objects[key]
                else:  # like GCS: the object itself (glob patterns aside), never a prefix
                    _Store.objects.pop(path, None)


def put(path: str, data: bytes) -> None:
    with FileSystems.create(path) as fh:
        fh.write(data)


def listing(prefix: str) -> list[str]:
    return sorted(m.path for m in FileSystems.match([prefix + "**"])[0].metadata_list)


def read_table(path: str) -> pa.Table:
    with FileSystems.open(path) as fh:
        return pq.read_table(io.BytesIO(fh.read()))


def read_kind(out: str, kind: str) -> pa.Table | None:
    """The rows of KIND in the current view (object stores have no `current/` link: summary.json
    lists its files)."""
    paths = [FileSystems.join(out, name) for name in read_summary(out)["files"] if kind_of(name) == kind]
    return pa.concat_tables([read_table(p) for p in paths]) if paths else None


@pytest.fixture(params=["local", "mem"])
def store(request, monkeypatch, tmp_path):
    """A corpus under a fresh root on the local disk or in mem://; yields the root."""
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
    root = str(tmp_path / "store") if request.param == "local" else f"{PREFIX}bucket-{time.monotonic_ns()}"
    put(FileSystems.join(root, "corpus", "part-0.parquet"), corpus_bytes())
    yield root
    if request.param == "mem":
        FileSystems.delete([root + "/"])


def corpus_bytes(rows: list[dict] | None = None) -> bytes:
    schema = pa.schema([("id", pa.string()), ("text", pa.string()), ("lang", pa.string())])
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(corpus_rows() if rows is None else rows, schema=schema), buf)
    return buf.getvalue()


@pytest.fixture
def mem_corpus(monkeypatch, tmp_path):
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
    monkeypatch.chdir(tmp_path)  # a plain open("mem://...") for writing would land here
    bucket = f"{PREFIX}bucket-{time.monotonic_ns()}"
    put(f"{bucket}/corpus/part-0.parquet", corpus_bytes())
    yield bucket
    FileSystems.delete([bucket + "/"])
    assert not list(tmp_path.iterdir()), "something wrote a user path to the local disk"


def job(root: str, sandbox, *extra: str) -> int:
    return run("--input", FileSystems.join(root, "corpus", "*.parquet"), "--output", FileSystems.join(root, "out"),
               "--model", MODEL, "--base-url", sandbox.base_url, "--keep-columns", "lang", *extra)


def test_the_store_behaves_like_an_object_store():
    bucket = f"{PREFIX}probe-{time.monotonic_ns()}"
    put(f"{bucket}/a/b.txt", b"x")
    assert FileSystems.exists(f"{bucket}/a/b.txt") and not FileSystems.exists(f"{bucket}/a")
    assert listing(bucket + "/") == [f"{bucket}/a/b.txt"]
    FileSystems.delete([f"{bucket}/a"])  # a prefix without '/' is not deleted, as on GCS
    assert listing(bucket + "/") == [f"{bucket}/a/b.txt"]
    FileSystems.delete([bucket + "/"])
    assert listing(bucket + "/") == []


def test_job_reads_and_writes_only_through_filesystems(mem_corpus, sandbox):
    bucket = mem_corpus
    for name in ("models.yaml", "pipeline.yaml"):  # the configs travel the same way
        put(f"{bucket}/conf/{name}", resources.files("configs").joinpath(name).read_bytes())
    assert job(bucket, sandbox, "--models-config", f"{bucket}/conf/models.yaml",
               "--run-config", f"{bucket}/conf/pipeline.yaml") == 0
    emb, req, failed = (read_kind(f"{bucket}/out", k) for k in ("embeddings", "requests", "failed"))
    good = {r["id"] for r in corpus_rows() if r["id"] and r["text"] and r["text"].strip() and r["id"] != "twice"}
    assert set(emb.column("doc_id").to_pylist()) == good
    assert failed.num_rows == 6
    summary = read_summary(f"{bucket}/out")
    assert summary["embedded"] == emb.num_rows and summary["requests"] == req.num_rows
    assert summary["reconciliation"]["rows_minus_requests_rub"] == 0
    assert set(summary["files"]) <= {p[len(f"{bucket}/out/"):] for p in listing(f"{bucket}/out/")}
    assert sorted(req.column("request_id").to_pylist()) == sorted(c["request_id"] for c in ledger(sandbox.db))


def test_plan_reads_only_through_filesystems(mem_corpus, sandbox, capsys):
    from pipeline.cli import main
    assert main(["plan", "--input", f"{mem_corpus}/corpus/*.parquet", "--model", MODEL,
                 "--base-url", sandbox.base_url, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["files"] == 1 and plan["chunks"] > 0 and plan["fits"]


def read_summary(out: str) -> dict:
    with FileSystems.open(FileSystems.join(out, "summary.json")) as fh:
        return json.loads(fh.read())


def test_the_journal_is_discarded_after_a_clean_run(store, sandbox):
    assert job(store, sandbox) == 0
    assert [p for p in listing(FileSystems.join(store, "out") + "/") if "/_journal/" in p] == []


def test_resume_delivers_nothing_twice(store, sandbox):
    out = FileSystems.join(store, "out")
    assert job(store, sandbox) == 0
    paid = len(ledger(sandbox.db))
    assert job(store, sandbox, "--resume") == 0
    assert len(ledger(sandbox.db)) == paid
    emb = read_kind(out, "embeddings")
    keys = list(zip(emb.column("doc_id").to_pylist(), emb.column("chunk_index").to_pylist(), strict=True))
    assert len(keys) == len(set(keys))
    assert read_summary(out)["cost_rub"] == 0


def test_the_next_days_sync_commits_through_filesystems(mem_corpus, sandbox):
    """A changed corpus on an object store: the commit rewrites the view's files and writes its
    manifest through FileSystems alone (no link there: summary.json lists the view)."""
    bucket, out = mem_corpus, f"{mem_corpus}/out"
    assert job(bucket, sandbox) == 0
    rows = [r for r in corpus_rows() if r["id"] != "en-1"]
    rows = [{**r, "text": r["text"] + " Edited."} if r["id"] == "en-2" else r for r in rows]
    put(f"{bucket}/corpus/part-0.parquet", corpus_bytes(rows))
    paid = len(ledger(sandbox.db))
    assert job(bucket, sandbox, "--sync") == 0
    assert len(ledger(sandbox.db)) == paid + 1   # the edited text alone
    summary = read_summary(out)
    assert summary["changes"]["edited"] == 1 and summary["changes"]["removed"] == 1
    emb = read_kind(out, "embeddings").to_pylist()
    assert "en-1" not in {r["doc_id"] for r in emb}
    edited = next(r["text"] for r in rows if r["id"] == "en-2")
    assert [r["text_sha256"] for r in emb if r["doc_id"] == "en-2"] == [hashlib.sha256(edited.encode()).hexdigest()]
    assert any(p.startswith(f"{out}/_segments/") for p in listing(out + "/"))   # a file of the view was rewritten
