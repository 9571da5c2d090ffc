"""Bad input, bad configuration and bad servers: each ends in a clear exit code and message,
never a traceback, and every row that reaches the job ends in exactly one of embeddings,
failed or pending.

Real components throughout: the CLI in-process, a sandbox subprocess over loopback HTTP, real
Parquet. The misbehaving servers (HTML, float lists, wrong vectors) are tiny stdlib HTTP
servers on 127.0.0.1 - the sandbox follows the spec and cannot misbehave that way.
"""
from __future__ import annotations

from itertools import pairwise
import base64
import collections
import http.server
import json
import logging
import random
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from service.catalog import load_models
from service.sandbox.embedder import embed_batch, embed_text
from service.tokenizer import get_encoding
from tests.conftest import SANDBOX_KEY, free_port
from tests.e2e.helpers import WORDS_EN, WORDS_RU, ledger, paragraph, read_kind, run, summary
from transforms.read.split import SplitConfig, Splitter

MODEL = "text-embedding-3-small"
SPEC = load_models()[MODEL]
REPO = Path(__file__).resolve().parents[2]


# -- helpers ---------------------------------------------------------------------------------

@pytest.fixture
def env_key(monkeypatch):
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)


@pytest.fixture
def sb(sandbox_factory, env_key):
    """A sandbox that logs every HTTP request, so "nothing was sent" can be checked."""
    return sandbox_factory(key=SANDBOX_KEY, balance=1000.0, args=["--log-level", "DEBUG"])


def api_calls(sandbox) -> list[str]:
    """Request lines the sandbox logged for /v1/ (healthz excluded)."""
    return [line for line in Path(sandbox.log_path).read_text().splitlines() if '"GET /v1/' in line
            or '"POST /v1/' in line]


def write_rows(path: Path, ids, texts, id_type=pa.string(), text_type=pa.string()) -> Path:
    pq.write_table(pa.table({"id": pa.array(ids, id_type), "text": pa.array(texts, text_type)}), path)
    return path


def good_corpus(tmp_path: Path) -> Path:
    return write_rows(tmp_path / "good.parquet", ["a", "b"], ["hello world", "another text"])


def fast_retry_config(tmp_path: Path, **client) -> Path:
    """configs/pipeline.yaml with a small retry budget, so dead servers fail fast."""
    doc = yaml.safe_load((REPO / "configs" / "pipeline.yaml").read_text())
    doc["client"].update({"max_attempts": 2, "initial_backoff_s": 0.05, "max_backoff_s": 0.1,
                          "max_total_s": 2.0, "connect_timeout_s": 1.0, "read_timeout_s": 10.0, **client})
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def models_config(tmp_path: Path, **changes) -> Path:
    doc = yaml.safe_load((REPO / "configs" / "models.yaml").read_text())
    doc["models"][MODEL].update(changes)
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def one_error(caplog, capsys, *words: str, one_line: bool = True) -> str:
    """Exactly one ERROR record, naming WORDS, and no traceback anywhere."""
    out, err = capsys.readouterr()
    assert "Traceback" not in caplog.text + out + err
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, errors
    message = errors[0]
    for word in words:
        assert word in message, message
    if one_line:
        assert "\n" not in message, message
    return message


def expected_chunks(rows: list[dict], model=SPEC) -> dict[str, int]:
    splitter = Splitter(get_encoding(), SplitConfig(max_tokens=model.chunk_tokens))
    return {r["id"]: len(splitter.split(r["id"], r["text"])) for r in rows}


def assert_accounted(out: Path, ids: list, chunks: dict[str, int] | None = None) -> dict:
    """Every input row in exactly one of embeddings / failed / pending.

    IDS are the input rows' ids in order (None for a null id). CHUNKS: chunk count per id
    that yields chunks (default: what the output rows say). Rows that yield no chunk (null,
    empty or whitespace text, duplicate or null id) must be one failed row with no chunk_index.
    Returns {kind: rows of that kind}."""
    kinds = {k: (t.to_pylist() if (t := read_kind(out, k)) is not None else [])
             for k in ("embeddings", "failed", "pending")}
    doc_level = collections.Counter(r["doc_id"] for r in kinds["failed"] if r["chunk_index"] is None)
    occurrences = collections.Counter(ids)
    for doc_id, n in occurrences.items():
        if doc_id is None or n > 1:
            assert doc_level[doc_id] == n, (doc_id, n, doc_level[doc_id])
    assert all(occurrences[d] for d in doc_level), f"failed rows for ids not in the input: {doc_level}"
    where: dict[tuple, set] = collections.defaultdict(set)
    counts: dict[str, set] = collections.defaultdict(set)
    spans: dict[tuple, list] = collections.defaultdict(list)
    for kind, rows in kinds.items():
        for r in rows:
            if r["chunk_index"] is None:
                continue
            assert doc_level[r["doc_id"]] == 0, f"{r['doc_id']} both failed as a row and has chunks"
            where[(r["doc_id"], r["chunk_index"])].add(kind)
            if "chunk_count" in r:
                counts[r["doc_id"]].add(r["chunk_count"])
            if kind == "embeddings":
                spans[(r["doc_id"], r["chunk_index"])].append((r["token_start"], r["token_end"]))
    assert all(len(k) == 1 for k in where.values()), {c: k for c, k in where.items() if len(k) > 1}
    for key, pieces in spans.items():  # several rows per chunk only as re-split pieces, disjoint
        pieces.sort()
        assert all(a[1] <= b[0] for a, b in pairwise(pieces)), (key, pieces)
    chunk_docs = {d for d, _ in where}
    if chunks is None:
        assert all(len(counts[d]) == 1 for d in chunk_docs), f"chunk counts unknown or inconsistent: {counts}"
        chunks = {d: next(iter(counts[d])) for d in chunk_docs}
    for doc_id, n in occurrences.items():
        if doc_id is None or n > 1 or doc_level[doc_id]:
            continue
        got = sorted(i for d, i in where if d == doc_id)
        assert got == list(range(chunks[doc_id])), (doc_id, got, chunks[doc_id])
    return kinds


# -- refused before anything is sent (exit 2) -------------------------------------------------

def usage_case(tmp_path, sb, caplog, capsys, *args, words=(), one_line=True, model=MODEL):
    out = tmp_path / "out"
    url = [] if "--base-url" in args else ["--base-url", sb.base_url]
    code = run(*args, "--output", str(out), "--model", model, *url)
    assert code == 2
    message = one_error(caplog, capsys, *words, one_line=one_line)
    assert api_calls(sb) == [] and ledger(sb.db) == []
    assert not out.exists() or not list(out.glob("*.parquet"))
    return message


def test_missing_input_file(tmp_path, sb, caplog, capsys):
    usage_case(tmp_path, sb, caplog, capsys, "--input", str(tmp_path / "nope.parquet"),
               words=("--input", "nope.parquet", "no file matches"))


def test_glob_matching_nothing(tmp_path, sb, caplog, capsys):
    (tmp_path / "corpus").mkdir()
    usage_case(tmp_path, sb, caplog, capsys, "--input", str(tmp_path / "corpus" / "*.parquet"),
               words=("*.parquet", "no file matches"))


def test_file_that_is_not_parquet(tmp_path, sb, caplog, capsys):
    path = tmp_path / "notes.parquet"
    path.write_text("id,text\n1,hello\n")
    usage_case(tmp_path, sb, caplog, capsys, "--input", str(path),
               words=(str(path), "not a readable Parquet file"))


def test_truncated_parquet(tmp_path, sb, caplog, capsys):
    whole = good_corpus(tmp_path).read_bytes()
    path = tmp_path / "truncated.parquet"
    path.write_bytes(whole[: len(whole) // 2])
    usage_case(tmp_path, sb, caplog, capsys, "--input", str(path),
               words=(str(path), "not a readable Parquet file"))


def test_one_bad_file_among_good_ones_refuses_the_whole_input(tmp_path, sb, caplog, capsys):
    (tmp_path / "in").mkdir()
    write_rows(tmp_path / "in" / "a.parquet", ["a"], ["fine"])
    (tmp_path / "in" / "b.parquet").write_bytes(b"PAR1 and then nothing")
    usage_case(tmp_path, sb, caplog, capsys, "--input", str(tmp_path / "in" / "*.parquet"),
               words=("b.parquet", "not a readable Parquet file"))


@pytest.mark.parametrize("column", ["id", "text"])
def test_missing_column(tmp_path, sb, caplog, capsys, column):
    path = tmp_path / "cols.parquet"
    other = "text" if column == "id" else "id"
    pq.write_table(pa.table({other: ["x"], "body": ["y"]}), path)
    usage_case(tmp_path, sb, caplog, capsys, "--input", str(path),
               words=(f"no column '{column}'", "columns:", "body"))


def test_text_column_of_integers(tmp_path, sb, caplog, capsys):
    path = write_rows(tmp_path / "ints.parquet", ["a", "b"], [1, 2], text_type=pa.int64())
    usage_case(tmp_path, sb, caplog, capsys, "--input", str(path),
               words=("text column 'text'", "int64", "expected a string column"))


def test_unknown_model_lists_the_known_ones(tmp_path, sb, caplog, capsys):
    message = usage_case(tmp_path, sb, caplog, capsys, "--input", str(good_corpus(tmp_path)),
                         model="text-embedding-9-huge", words=("unknown model 'text-embedding-9-huge'",))
    assert all(name in message for name in load_models())


def test_models_config_that_is_not_yaml(tmp_path, sb, caplog, capsys):
    bad = tmp_path / "models.yaml"
    bad.write_text("models: [text-embedding-3-small: {max_input_tokens: 8191\n")
    # PyYAML's message points at the line and column over several lines: accepted, the first
    # line names the file and the problem.
    message = usage_case(tmp_path, sb, caplog, capsys, "--input", str(good_corpus(tmp_path)),
                         "--models-config", str(bad), words=(str(bad), "not valid YAML"), one_line=False)
    assert message.splitlines()[0].startswith(f"{bad}: not valid YAML")


@pytest.mark.parametrize("change, words", [
    ({"max_input_tokens": -5}, ("max_input_tokens must be a positive integer", "-5")),
    ({"tokenizer": "o200k_base"}, ("tokenizer 'o200k_base' is not available offline",)),
    ({"safety_factor": 1.5}, ("safety_factor must be in (0, 1]",)),
])
def test_models_config_with_wrong_values(tmp_path, sb, caplog, capsys, change, words):
    path = models_config(tmp_path, **change)
    usage_case(tmp_path, sb, caplog, capsys, "--input", str(good_corpus(tmp_path)),
               "--models-config", str(path), words=(str(path), f"model '{MODEL}'", *words))


def test_models_config_missing_file(tmp_path, sb, caplog, capsys):
    usage_case(tmp_path, sb, caplog, capsys, "--input", str(good_corpus(tmp_path)),
               "--models-config", str(tmp_path / "nope.yaml"), words=("nope.yaml", "cannot read"))


def test_output_under_a_regular_file(tmp_path, sb, caplog, capsys):
    # Tests run as root, for whom chmod 500 does not stop writes: a path below a file does.
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a directory")
    out = blocker / "out"
    code = run("--input", str(good_corpus(tmp_path)), "--output", str(out), "--model", MODEL,
               "--base-url", sb.base_url)
    assert code == 2
    one_error(caplog, capsys, "--output", str(out), "not writable")
    assert api_calls(sb) == [] and ledger(sb.db) == []


def test_missing_api_key(tmp_path, sb, caplog, capsys, monkeypatch):
    monkeypatch.delenv("EMBEDDINGS_API_KEY")
    usage_case(tmp_path, sb, caplog, capsys, "--input", str(good_corpus(tmp_path)),
               words=("EMBEDDINGS_API_KEY", "--api-key-file"))


def test_resume_into_another_models_output(tmp_path, sb, caplog, capsys):
    corpus, out = good_corpus(tmp_path), tmp_path / "out"
    assert run("--input", str(corpus), "--output", str(out), "--model", "text-embedding-3-large",
               "--base-url", sb.base_url) == 0
    charges = ledger(sb.db)
    caplog.clear()
    capsys.readouterr()
    posts_before = sum('"POST ' in line for line in api_calls(sb))
    code = run("--input", str(corpus), "--output", str(out), "--model", MODEL, "--base-url", sb.base_url,
               "--resume")
    assert code == 2
    one_error(caplog, capsys, "--resume", "text-embedding-3-large", MODEL, "--output")
    # The account is read before the check (two GETs), but no embeddings request is sent.
    assert sum('"POST ' in line for line in api_calls(sb)) == posts_before
    assert ledger(sb.db) == charges
    assert len(list(out.glob("history/*/embeddings-*.parquet"))) == 1


@pytest.mark.parametrize("url", ["ftp://127.0.0.1/v1", "http://user:secret@127.0.0.1:9/v1", "127.0.0.1:9/v1"])
def test_base_url_that_is_not_an_http_url(tmp_path, sb, caplog, capsys, url):
    usage_case(tmp_path, sb, caplog, capsys, "--input", str(good_corpus(tmp_path)), "--base-url", url,
               words=("base", "URL"))


@pytest.mark.parametrize("flag", [["--max-spend-rubs", "0.000001"], ["--max-spend", "0.000001"], ["--resum"]])
def test_misspelled_flag_is_refused_before_spending(tmp_path, sb, caplog, capsys, flag):
    usage_case(tmp_path, sb, caplog, capsys, "--input", str(good_corpus(tmp_path)), *flag, words=(flag[0],))


@pytest.mark.parametrize("column", ["model", "request_id", "token_start"])
def test_kept_column_named_like_an_output_column(tmp_path, sb, caplog, capsys, column):
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": ["a"], "text": ["hello"], column: ["clash"]}), path)
    usage_case(tmp_path, sb, caplog, capsys, "--input", str(path), "--keep-columns", column,
               words=("--keep-columns", column))


@pytest.mark.parametrize("second_model", [MODEL, "text-embedding-3-large"])
def test_rerun_into_a_used_output_without_resume_is_refused(tmp_path, sb, caplog, capsys, second_model):
    corpus, out = good_corpus(tmp_path), tmp_path / "out"
    assert run("--input", str(corpus), "--output", str(out), "--model", MODEL, "--base-url", sb.base_url) == 0
    charges = ledger(sb.db)
    caplog.clear()
    capsys.readouterr()
    code = run("--input", str(corpus), "--output", str(out), "--model", second_model, "--base-url", sb.base_url)
    assert ledger(sb.db) == charges  # the same texts not paid twice; no second model's files beside
    assert code == 2
    one_error(caplog, capsys, "--output", "--resume")


# -- rows the job takes and accounts for ------------------------------------------------------

def run_ok(tmp_path, sandbox, path, *extra) -> Path:
    out = tmp_path / "out"
    code = run("--input", str(path), "--output", str(out), "--model", MODEL, "--base-url", sandbox.base_url,
               *extra)
    assert code == 0
    return out


def test_null_and_duplicate_ids_and_empty_texts_fail_as_rows(tmp_path, sb):
    rows = [("ok-1", "a fine text"), (None, "no id here"), (None, "nor here"), ("dup", "first"),
            ("dup", "second"), ("dup", "third"), ("null-text", None), ("empty", ""),
            ("blank", " \n\t\u00a0\u2003 "), ("ok-2", "another fine text")]
    ids = [i for i, _ in rows]
    out = run_ok(tmp_path, sb, write_rows(tmp_path / "c.parquet", ids, [t for _, t in rows]))
    kinds = assert_accounted(out, ids, {"ok-1": 1, "ok-2": 1})
    reasons = collections.Counter((r["doc_id"], r["reason"]) for r in kinds["failed"])
    assert reasons == {(None, "null_id"): 2, ("dup", "duplicate_id"): 3, ("null-text", "null_text"): 1,
                       ("empty", "empty_text"): 1, ("blank", "empty_text"): 1}
    assert all(r["detail"] for r in kinds["failed"])
    assert {r["doc_id"] for r in kinds["embeddings"]} == {"ok-1", "ok-2"}
    sent = [h for c in ledger(sb.db) for h in c["input_sha256"]]
    assert len(sent) == 2  # nothing but the two good texts was ever sent


def test_integer_ids_are_accepted_and_null_ones_fail(tmp_path, sb):
    ids = [1, 2, None, 2]
    out = run_ok(tmp_path, sb, write_rows(tmp_path / "c.parquet", ids, ["one", "two", "three", "two again"],
                                          id_type=pa.int64()))
    kinds = assert_accounted(out, ["1", "2", None, "2"], {"1": 1})
    assert {r["doc_id"] for r in kinds["embeddings"]} == {"1"}
    assert collections.Counter(r["reason"] for r in kinds["failed"]) == {"duplicate_id": 2, "null_id": 1}


def test_dictionary_encoded_string_columns_are_read(tmp_path, sb):
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": pa.array(["a", "b", "c"]).dictionary_encode(),
                             "text": pa.array(["same text", "same text", "other"]).dictionary_encode()}), path)
    out = run_ok(tmp_path, sb, path)
    kinds = assert_accounted(out, ["a", "b", "c"], {"a": 1, "b": 1, "c": 1})
    assert len(kinds["embeddings"]) == 3


def test_special_tokens_are_embedded_as_plain_text(tmp_path, sb):
    texts = ["<|endoftext|>", "<|endoftext|><|fim_prefix|><|fim_middle|><|fim_suffix|><|endofprompt|>"]
    out = run_ok(tmp_path, sb, write_rows(tmp_path / "c.parquet", ["eot", "all"], texts))
    kinds = assert_accounted(out, ["eot", "all"], {"eot": 1, "all": 1})
    enc = get_encoding()
    by_id = {r["doc_id"]: r for r in kinds["embeddings"]}
    for doc_id, text in zip(["eot", "all"], texts, strict=True):
        row = by_id[doc_id]
        assert row["n_tokens"] == len(enc.encode_ordinary(text)) > 1  # not one special token
        np.testing.assert_array_equal(np.asarray(row["embedding"], np.float32), embed_text(MODEL, text, 1536))
    assert sum(c["prompt_tokens"] for c in ledger(sb.db)) == sum(r["n_tokens"] for r in kinds["embeddings"])


def test_python_strings_with_lone_surrogates_cannot_enter_arrow():
    # What a corpus writer meets first: pyarrow refuses to encode a lone surrogate, so a string
    # column cannot be built from such a str. Parquet written by pyarrow is therefore valid UTF-8.
    with pytest.raises(UnicodeEncodeError, match="surrogates not allowed"):
        pa.array(["fine", "bad \ud800 half"], pa.string())


def test_invalid_utf8_in_a_string_column_fails_that_row(tmp_path, sb, caplog, capsys):
    # Writers that do not validate (other languages, `view(pa.string())`) can still put the
    # UTF-8 encoding of a surrogate, or a stray byte, into a Parquet string column.
    raw = pa.array([b"a fine text", b"half a pair \xed\xa0\x80 here", b"stray \xff byte"], pa.binary())
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": ["ok", "surrogate", "byte"], "text": raw.view(pa.string())}), path)
    code = run("--input", str(path), "--output", str(tmp_path / "out"), "--model", MODEL,
               "--base-url", sb.base_url)
    out, err = capsys.readouterr()
    assert "Traceback" not in caplog.text + out + err
    assert code == 0
    kinds = assert_accounted(tmp_path / "out", ["ok", "surrogate", "byte"], {"ok": 1})
    assert {r["doc_id"] for r in kinds["failed"]} == {"surrogate", "byte"}
    assert all("utf" in (r["reason"] + r["detail"]).lower() for r in kinds["failed"])


@pytest.mark.soak   # slow: make soak
def test_twenty_megabyte_text_completes_in_chunks_within_the_limit(tmp_path, sb):
    rng = random.Random(20)
    parts, size = [], 0
    while size < 20_000_000:
        parts.append(paragraph(rng, WORDS_EN + WORDS_RU, 200))
        size += len(parts[-1].encode())
    text = "\n\n".join(parts)
    path = write_rows(tmp_path / "c.parquet", ["huge", "small"], [text, "a small one"])
    started = time.monotonic()
    out = run_ok(tmp_path, sb, path)
    print(f"20 MB text: {time.monotonic() - started:.1f} s")
    kinds = assert_accounted(out, ["huge", "small"])
    huge = sorted((r for r in kinds["embeddings"] if r["doc_id"] == "huge"), key=lambda r: r["chunk_index"])
    assert len(huge) > 300
    assert all(r["n_tokens"] <= SPEC.chunk_tokens for r in huge)
    assert [r["token_start"] for r in huge[1:]] == [r["token_end"] for r in huge[:-1]]
    charges = ledger(sb.db)
    assert sum(c["prompt_tokens"] for c in charges) == huge[-1]["token_end"] + len(
        get_encoding().encode_ordinary("a small one"))
    assert all(c["total_tokens"] <= SPEC.max_tokens_per_request for c in charges)


# -- servers that do not behave -----------------------------------------------------------------

def test_unreachable_base_url(tmp_path, env_key, caplog, capsys):
    port = free_port()   # nobody listens there
    started = time.monotonic()
    code = run("--input", str(good_corpus(tmp_path)), "--output", str(tmp_path / "out"), "--model", MODEL,
               "--base-url", f"http://127.0.0.1:{port}/v1", "--run-config", str(fast_retry_config(tmp_path)))
    print(f"unreachable service: exit after {time.monotonic() - started:.1f} s")
    assert code == 1
    one_error(caplog, capsys, "could not be used", f"127.0.0.1:{port}", "Connection refused")
    assert not list((tmp_path / "out").glob("*"))


class MisbehavingServer:
    """A stdlib HTTP server on loopback that answers the account endpoints like the spec and
    embeddings as MODE says: html (200 text/html), html502, float (ignores base64),
    short (vectors of the wrong length), count (one vector too few); or HTML on every path
    (html_everywhere: 200, 502_everywhere: 502), as a login page or a dead proxy would."""

    def __init__(self, mode: str, balance: float = 100.0):
        self.mode, self.balance, self.formats = mode, balance, []
        self._lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                if outer.mode.endswith("_everywhere"):
                    status = 502 if outer.mode.startswith("502") else 200
                    return outer.send(self, status, b"<html><body>Sign in</body></html>", "text/html")
                doc = ({"balance": outer.balance} if self.path.endswith("/balance")
                       else {"daily_usage": 0.0, "monthly_usage": 0.0})
                outer.send(self, 200, json.dumps(doc).encode())

            def do_POST(self):
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.send(self, *outer.embeddings(request))

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    @staticmethod
    def send(handler, status: int, body: bytes, ctype: str = "application/json"):
        handler.send_response(status)
        handler.send_header("Content-Type", ctype)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def embeddings(self, request: dict):
        self.formats.append(request.get("encoding_format"))
        if self.mode == "html":
            return 200, b"<html><body>proxy error</body></html>", "text/html"
        if self.mode == "html502":
            return 502, b"<html><body>502 Bad Gateway</body></html>", "text/html"
        texts = request["input"]
        tokens = sum(len(get_encoding().encode_ordinary(t)) for t in texts)
        vectors = embed_batch(request["model"], texts, 1000 if self.mode == "short" else 1536, 1536)
        if self.mode == "count":
            vectors = vectors[:-1]
        as_float = self.mode == "float" or request.get("encoding_format") != "base64"
        data = [{"object": "embedding", "index": i,
                 "embedding": v.tolist() if as_float else base64.b64encode(v.astype("<f4").tobytes()).decode()}
                for i, v in enumerate(vectors)]
        with self._lock:
            cost = round(tokens * SPEC.price_per_token, 6)
            self.balance = round(self.balance - cost, 6)
            usage = {"prompt_tokens": tokens, "total_tokens": tokens, "cost_rub": cost, "balance": self.balance}
        return 200, json.dumps({"object": "list", "data": data, "model": request["model"], "usage": usage}).encode()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def misbehaving():
    servers = []

    def make(mode: str) -> MisbehavingServer:
        servers.append(MisbehavingServer(mode))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


def small_corpus(tmp_path: Path, n: int = 12) -> tuple[Path, list[dict]]:
    rng = random.Random(n)
    rows = [{"id": f"d{i}", "text": paragraph(rng, WORDS_EN, 8 + i)} for i in range(n)]
    rows.append({"id": "gone", "text": None})
    return write_rows(tmp_path / "c.parquet", [r["id"] for r in rows], [r["text"] for r in rows]), rows


SMALL_IDS = [f"d{i}" for i in range(12)] + ["gone"]
SMALL_CHUNKS = {f"d{i}": 1 for i in range(12)}


def run_against(tmp_path, server, *extra) -> tuple[int, Path]:
    path, _ = small_corpus(tmp_path)
    out = tmp_path / "out"
    code = run("--input", str(path), "--output", str(out), "--model", MODEL, "--base-url", server.base_url,
               "--run-config", str(fast_retry_config(tmp_path)), *extra)
    return code, out


@pytest.mark.parametrize("mode, words", [
    ("html_everywhere", ("could not be used", "HTTP 200 with a non-JSON body (text/html")),
    ("502_everywhere", ("could not be used", "HTTP 502", "non-JSON body (text/html")),
])
def test_html_from_the_account_endpoint_stops_before_sending(tmp_path, env_key, misbehaving, caplog, capsys,
                                                             mode, words):
    server = misbehaving(mode)
    code, out = run_against(tmp_path, server)
    assert code == 1
    one_error(caplog, capsys, *words)
    assert server.formats == []  # no embeddings request
    assert not list(out.glob("*.parquet"))


def test_html_502_from_embeddings_leaves_everything_pending(tmp_path, env_key, misbehaving, caplog, capsys):
    server = misbehaving("html502")
    code, out = run_against(tmp_path, server)
    assert code == 1
    kinds = assert_accounted(out, SMALL_IDS, SMALL_CHUNKS)
    assert len(kinds["pending"]) == 12 and {r["reason"] for r in kinds["pending"]} == {"service_unavailable"}
    assert summary(out)["exit_code"] == 1
    out_, err = capsys.readouterr()
    assert "Traceback" not in caplog.text + out_ + err
    errors = " ".join(r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)
    assert "HTTP 502" in errors and "service_unavailable" in errors and "--resume" in errors
    assert len(server.formats) == 2  # the retry budget of fast_retry_config, then the breaker


def test_html_200_from_embeddings_dead_letters_with_a_reason(tmp_path, env_key, misbehaving, caplog, capsys):
    server = misbehaving("html")
    code, out = run_against(tmp_path, server)
    # Every chunk is dead-lettered (not billed: no usage in an HTML body), so the contract's
    # exit code is 0. A whole corpus dead-lettered by a broken proxy is easy to miss: see the
    # report ("invalid responses should trip the breaker").
    assert code == 0
    kinds = assert_accounted(out, SMALL_IDS, SMALL_CHUNKS)
    assert kinds["embeddings"] == []
    chunk_failures = [r for r in kinds["failed"] if r["chunk_index"] is not None]
    assert len(chunk_failures) == 12
    assert {r["reason"] for r in chunk_failures} == {"invalid_response"}
    assert all("non-JSON body (text/html" in r["detail"] for r in chunk_failures)
    out_, err = capsys.readouterr()
    assert "Traceback" not in caplog.text + out_ + err
    assert "<html>" not in caplog.text + out_ + err  # described, not quoted


def test_server_ignoring_base64_falls_back_to_float(tmp_path, env_key, misbehaving):
    server = misbehaving("float")
    models = models_config(tmp_path, max_inputs_per_request=3)
    code, out = run_against(tmp_path, server, "--models-config", str(models), "--max-in-flight", "1")
    assert code == 0
    rows = {r["id"]: r["text"] for r in small_corpus(tmp_path)[1]}
    kinds = assert_accounted(out, SMALL_IDS, SMALL_CHUNKS)
    assert len(kinds["embeddings"]) == 12
    for row in kinds["embeddings"]:
        np.testing.assert_array_equal(np.asarray(row["embedding"], np.float32),
                                      embed_text(MODEL, rows[row["doc_id"]], 1536))
    assert server.formats[0] == "base64" and server.formats[-1] == "float"  # asked for float after
    s = summary(out)
    assert s["reconciliation"]["rows_minus_requests_rub"] == 0
    assert s["reconciliation"]["balance_minus_requests_rub"] == 0


@pytest.mark.parametrize("mode, reason, detail", [
    ("short", "wrong_dimensions", "vectors of length 1000, expected 1536"),
    ("count", "invalid_response", "11 embeddings for 12 inputs"),
])
def test_wrong_vectors_are_dead_lettered_and_the_bill_named(tmp_path, env_key, misbehaving, mode, reason, detail):
    server = misbehaving(mode)
    code, out = run_against(tmp_path, server)
    assert code == 0
    kinds = assert_accounted(out, SMALL_IDS, SMALL_CHUNKS)
    chunk_failures = [r for r in kinds["failed"] if r["chunk_index"] is not None]
    assert kinds["embeddings"] == [] and len(chunk_failures) == 12
    assert {r["reason"] for r in chunk_failures} == {reason}
    assert all(detail in r["detail"] for r in chunk_failures)
    s = summary(out)
    recon = s["reconciliation"]
    # The service billed the request; no row carries that cost, and the summary says so.
    assert recon["rows_cost_rub"] == 0 and recon["requests_cost_rub"] > 0
    assert recon["rows_minus_requests_rub"] == -recon["requests_cost_rub"]
    assert recon["balance_minus_requests_rub"] == 0
    assert any("billed" in note for note in recon["notes"])


@pytest.mark.parametrize("mode, reason", [
    ("short", "wrong_dimensions"),
    ("count", "invalid_response"),
    ("html", "invalid_response"),
])
def test_unusable_answers_stop_the_run_after_the_first(tmp_path, env_key, misbehaving, mode, reason):
    server = misbehaving(mode)
    models = models_config(tmp_path, max_inputs_per_request=3)  # four requests, sent one at a time
    code, out = run_against(tmp_path, server, "--models-config", str(models), "--max-in-flight", "1")
    kinds = assert_accounted(out, SMALL_IDS, SMALL_CHUNKS)
    assert kinds["embeddings"] == []
    assert {r["reason"] for r in kinds["failed"] if r["chunk_index"] is not None} == {reason}
    assert len(server.formats) == 1  # nothing sent after the first unusable answer
    assert code == 1
    assert len(kinds["pending"]) == 9 and {r["reason"] for r in kinds["pending"]} == {"invalid_answers"}
