"""The API key never leaves the Authorization header: not into logs (at DEBUG), stdout/stderr,
output files, the journal, the sandbox's log and ledger, the pipeline options Beam records,
the pickled DoFns of the job graph, or the text of any error.

A recognisable key ("sk-LEAKCHECK-<uuid>") is searched for in every byte we can get hold of,
together with its unique part alone (a key printed half-masked would still be found).
"""
from __future__ import annotations

import base64
import bz2
import http.server
import json
import logging
import pickle
import re
import threading
import traceback
import uuid
import zlib
from pathlib import Path

import apache_beam as beam
import pytest
import requests

from pipeline.cli import main
from service import errors
from service.client import EmbeddingsClient, RetryPolicy
from service.credentials import ApiKey
from tests.e2e.helpers import corpus_rows, ledger, read_kind, run, write_corpus

MODEL = "text-embedding-3-small"


def leak_key() -> str:
    return f"sk-LEAKCHECK-{uuid.uuid4().hex}"


def needles(key: str) -> list[bytes]:
    unique = key.rsplit("-", 1)[1]
    return [key.encode(), unique.encode(), base64.b64encode(key.encode()), key.encode("utf-16-le")]


def hits(key: str, blobs: dict[str, bytes]) -> list[str]:
    """Names of the blobs that hold the key in any of its forms."""
    return [name for name, blob in blobs.items() for n in needles(key) if n in blob]


def files_under(*roots: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for root in roots for p in Path(root).rglob("*") if p.is_file()}


def log_blobs(caplog) -> dict[str, bytes]:
    blobs = {"caplog.text": caplog.text.encode()}
    for i, r in enumerate(caplog.records):
        blobs[f"record {i}"] = (repr(r.__dict__) + r.getMessage() + (r.exc_text or "")).encode()
    return blobs


def test_the_scan_finds_a_key_where_there_is_one(tmp_path):
    key = leak_key()
    (tmp_path / "a.txt").write_text(f"Authorization: Bearer {key}")
    (tmp_path / "b.bin").write_bytes(pickle.dumps({"k": key.rsplit("-", 1)[1][:32]}))
    (tmp_path / "c.txt").write_text("nothing here")
    assert sorted(Path(h).name for h in set(hits(key, files_under(tmp_path)))) == ["a.txt", "b.bin"]


@pytest.fixture
def leak_sandbox(sandbox_factory):
    key = leak_key()
    return key, sandbox_factory(key=key, balance=1000.0, args=["--log-level", "DEBUG"])


def test_a_whole_run_and_plan_never_show_the_key(tmp_path, leak_sandbox, monkeypatch, caplog, capfd):
    key, sb = leak_sandbox
    monkeypatch.setenv("EMBEDDINGS_API_KEY", key)
    caplog.set_level(logging.DEBUG)
    corpus, out = write_corpus(tmp_path / "corpus.parquet"), tmp_path / "out"
    common = ["--input", str(corpus), "--model", MODEL, "--base-url", sb.base_url, "--verbose"]
    assert main(["plan", *common, "--json"]) == 0
    assert main(["plan", *common]) == 0
    assert main(["run", *common, "--output", str(out), "--keep-columns", "lang"]) == 0
    assert read_kind(out, "embeddings").num_rows > 20  # it really ran, and logged at DEBUG
    assert any(r.levelno == logging.DEBUG for r in caplog.records)
    stdout, stderr = capfd.readouterr()
    blobs = {**log_blobs(caplog), "stdout": stdout.encode(), "stderr": stderr.encode(),
             **files_under(out, Path(sb.db).parent),  # outputs, summary, sandbox db + WAL + log
             "ledger": json.dumps(ledger(sb.db)).encode()}
    assert any(name.endswith("sandbox.db.log") for name in blobs) and any("summary.json" in n for n in blobs)
    assert hits(key, blobs) == []


def test_a_run_with_a_key_file_never_shows_the_key(tmp_path, leak_sandbox, monkeypatch, caplog, capfd):
    key, sb = leak_sandbox
    monkeypatch.delenv("EMBEDDINGS_API_KEY", raising=False)
    key_file = tmp_path / "secret" / "key.txt"
    key_file.parent.mkdir()
    key_file.write_text(key + "\n")
    caplog.set_level(logging.DEBUG)
    out = tmp_path / "out"
    assert run("--input", str(write_corpus(tmp_path / "corpus.parquet")), "--output", str(out),
               "--model", MODEL, "--base-url", sb.base_url, "--api-key-file", str(key_file), "--verbose") == 0
    stdout, stderr = capfd.readouterr()
    blobs = {**log_blobs(caplog), "stdout": stdout.encode(), "stderr": stderr.encode(), **files_under(out)}
    assert hits(key, blobs) == []


@pytest.fixture
def built_pipelines(monkeypatch):
    """What every Beam pipeline the CLI runs holds when it is handed to the runner: its
    serialized proto and its options. A spy: the pipeline still runs as built."""
    seen = []
    original = beam.Pipeline.run

    def run_and_keep(self, *args, **kwargs):
        seen.append({"proto": self.to_runner_api().SerializeToString(), "options": self.options})
        return original(self, *args, **kwargs)

    monkeypatch.setattr(beam.Pipeline, "run", run_and_keep)
    return seen


def unpacked_pickles(blob: bytes) -> list[bytes]:
    """Beam stores pickled DoFns, coders and window fns as base64 of bz2 (or zlib): plain
    text search would miss a key inside them. Every such payload, decompressed."""
    found = []
    for match in re.finditer(rb"[A-Za-z0-9+/]{40,}={0,2}", blob):
        try:
            raw = base64.b64decode(match.group(), validate=True)
        except ValueError:
            continue
        for decompress in (bz2.decompress, zlib.decompress):
            try:
                found.append(decompress(raw))
                break
            except (OSError, ValueError, zlib.error):
                continue
    return found


@pytest.mark.parametrize("where", ["env", "file"])
def test_options_and_pickled_graph_hold_no_key(tmp_path, leak_sandbox, monkeypatch, built_pipelines, where):
    key, sb = leak_sandbox
    argv = ["--input", str(write_corpus(tmp_path / "corpus.parquet")), "--model", MODEL,
            "--base-url", sb.base_url, "--keep-columns", "lang"]
    if where == "env":
        monkeypatch.setenv("EMBEDDINGS_API_KEY", key)
    else:
        monkeypatch.delenv("EMBEDDINGS_API_KEY", raising=False)
        (tmp_path / "key.txt").write_text(key)
        argv += ["--api-key-file", str(tmp_path / "key.txt")]
    assert main(["plan", *argv]) == 0
    assert main(["run", *argv, "--output", str(tmp_path / "out")]) == 0
    assert len(built_pipelines) >= 2  # the plan's and the run's
    blobs = {}
    embed_fns = []
    for i, built in enumerate(built_pipelines):
        pickles = unpacked_pickles(built["proto"])
        embed_fns += [pk for pk in pickles if b"_EmbedDoFn" in pk]
        opts = built["options"]
        blobs.update({f"{i} proto": built["proto"], **{f"{i} pickle {j}": pk for j, pk in enumerate(pickles)},
                      f"{i} options": repr(opts.get_all_options()).encode(),
                      f"{i} options json": json.dumps(opts.get_all_options(), default=str).encode(),
                      f"{i} display data": repr(opts.display_data()).encode()})
    # The run's Embed DoFn is in there, with its config (the base URL, where the key comes from).
    assert embed_fns and all(sb.base_url.encode() in fn and b"KeySource" in fn for fn in embed_fns)
    assert hits(key, blobs) == []
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(ApiKey(key))


def error_texts(exc: BaseException) -> dict[str, bytes]:
    return {"str": str(exc).encode(), "repr": repr(exc).encode(), "args": repr(exc.args).encode(),
            "dict": repr(vars(exc)).encode(), "pickle": pickle.dumps(exc),
            "traceback": "".join(traceback.format_exception(exc)).encode()}


def test_a_wrong_key_fails_cleanly_and_is_never_shown(tmp_path, leak_sandbox, monkeypatch, caplog, capfd):
    right, sb = leak_sandbox
    wrong = leak_key()
    monkeypatch.setenv("EMBEDDINGS_API_KEY", wrong)
    caplog.set_level(logging.DEBUG)
    out = tmp_path / "out"
    code = run("--input", str(write_corpus(tmp_path / "corpus.parquet")), "--output", str(out),
               "--model", MODEL, "--base-url", sb.base_url, "--verbose")
    assert code == 1
    errors_logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors_logged) == 1 and "EMBEDDINGS_API_KEY" in errors_logged[0] and "401" in errors_logged[0]
    with EmbeddingsClient(sb.base_url, ApiKey(wrong), retry=RetryPolicy(max_attempts=1)) as client:
        caught = []
        for call in (lambda: client.embed(MODEL, ["hello"]), client.balance, client.stats):
            with pytest.raises(errors.AuthenticationError) as info:
                call()
            caught.append(info.value)
        assert wrong not in repr(client)
    stdout, stderr = capfd.readouterr()
    blobs = {**log_blobs(caplog), "stdout": stdout.encode(), "stderr": stderr.encode(),
             **files_under(out, Path(sb.db).parent)}
    for i, exc in enumerate(caught):
        blobs.update({f"error {i} {k}": v for k, v in error_texts(exc).items()})
    assert hits(wrong, blobs) == [] and hits(right, blobs) == []
    assert ledger(sb.db) == []


class EchoingProxy:
    """A loopback server that answers every embeddings request 400 quoting the request's
    Authorization header, as a careless proxy would; account endpoints answer normally."""

    def __init__(self):
        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _send(self, status, doc):
                body = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._send(200, {"balance": 100.0} if self.path.endswith("/balance")
                           else {"daily_usage": 0.0, "monthly_usage": 0.0})

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                auth = self.headers.get("Authorization")
                self._send(400, {"error": {"code": f"bad_auth {auth}", "type": "invalid_request_error",
                                           "message": f"refused request with Authorization: {auth}"}})

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_a_server_echoing_the_key_in_errors_does_not_put_it_in_failed_rows(tmp_path, monkeypatch, caplog, capfd):
    key = leak_key()
    monkeypatch.setenv("EMBEDDINGS_API_KEY", key)
    caplog.set_level(logging.DEBUG)
    proxy = EchoingProxy()
    try:
        out = tmp_path / "out"
        rows = [r for r in corpus_rows() if r["id"] in ("en-0", "en-1", "ru-0")]
        code = run("--input", str(write_corpus(tmp_path / "c.parquet", rows)), "--output", str(out),
                   "--model", MODEL, "--base-url", proxy.base_url, "--verbose")
    finally:
        proxy.close()
    assert code == 0  # every chunk dead-lettered as a bad request
    failed = read_kind(out, "failed").to_pylist()
    assert {r["reason"] for r in failed} == {"bad_request"} and len(failed) == 3
    assert all("[REDACTED]" in r["detail"] for r in failed)
    stdout, stderr = capfd.readouterr()
    blobs = {**log_blobs(caplog), "stdout": stdout.encode(), "stderr": stderr.encode(), **files_under(out)}
    assert hits(key, blobs) == []


def test_the_sandbox_answers_every_bad_key_alike(leak_sandbox):
    right, sb = leak_sandbox
    variants = {"missing": None, "wrong": f"Bearer {leak_key()}", "empty": "Bearer ",
                "other scheme": f"Basic {right}", "no scheme": right, "prefix": f"Bearer {right[:-1]}"}
    for method, path, body in (("POST", "/embeddings", {"model": MODEL, "input": ["hi"]}),
                               ("GET", "/service/balance", None)):
        answers = {}
        for name, header in variants.items():
            headers = {} if header is None else {"Authorization": header}
            r = requests.request(method, sb.base_url + path, json=body, headers=headers, timeout=10)
            answers[name] = (r.status_code, r.content,
                             sorted((k, v) for k, v in r.headers.items() if k.lower() != "date"))
        assert answers["missing"][0] == 401
        assert all(a == answers["missing"] for a in answers.values()), answers
        assert right.encode() not in answers["missing"][1]
    assert ledger(sb.db) == []


class NotSubmitted(Exception):
    """Raised where the CLI hands its pipeline to Dataflow, which cannot be reached from here."""


def test_the_dataflow_job_graph_holds_no_key(leak_sandbox, monkeypatch, tmp_path):
    """The job as Dataflow would get it: the shipped profile's options, input and DIR on an
    object store (mem://, like gs://), the graph of a runner whose workers are elsewhere
    (texts grouped by digest). Built and serialized, never submitted."""
    from tests.e2e.test_filesystems import PREFIX, corpus_bytes, put
    key, sb = leak_sandbox
    monkeypatch.setenv("EMBEDDINGS_API_KEY", key)
    monkeypatch.chdir(tmp_path)
    bucket = f"{PREFIX}dataflow-{uuid.uuid4().hex}"
    put(f"{bucket}/corpus/part-0.parquet", corpus_bytes())
    built = []

    def keep_and_stop(self, *args, **kwargs):
        built.append({"proto": self.to_runner_api().SerializeToString(), "options": self.options})
        raise NotSubmitted("not submitted")

    monkeypatch.setattr(beam.Pipeline, "run", keep_and_stop)
    code = run("--profile", "dataflow", "--region", "us-central1", "--input", f"{bucket}/corpus/*.parquet",
               "--output", f"{bucket}/out", "--model", MODEL, "--base-url", sb.base_url)
    assert code == 1 and len(built) == 1 and ledger(sb.db) == []
    proto, opts = built[0]["proto"], built[0]["options"].get_all_options()
    assert opts["runner"] == "DataflowRunner" and opts["project"] == "my-project"
    assert b"beam:transform:group_by_key:v1" in proto
    pickles = unpacked_pickles(proto)
    assert any(b"_EmbedDoFn" in pk and b"KeySource" in pk for pk in pickles)
    blobs = {"proto": proto, "options": json.dumps(opts, default=str).encode(),
             **{f"pickle {j}": pk for j, pk in enumerate(pickles)}}
    assert hits(key, blobs) == []
