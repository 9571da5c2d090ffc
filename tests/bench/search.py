"""`search` on the larger published table (docs/BENCH.md, "Publishing to PostgreSQL"): p50 of each
mode, the SQL part (the statement search runs, with its settings, on one warm connection:
pipeline/publish/search.py; its wall and the server process's CPU) and the whole command
(`python -m pipeline search ... --json`, a child process: the interpreter's start, the query's
request to the sandbox, the statement, the output); the vector leg's recall@10 against an exact
scan; how many rows the text leg's queries match.

The timed queries are what users type: two or three consecutive words of passages not in the
corpus (prose, code and Russian as the corpus mixes them), so some words are rare and some in
most rows. The recall is the vector leg's statement on the section's 400-character passages:
the sandbox's vector of two or three words, cut to 256 dimensions, has a median of 2 values
that are not 0 (a model's is dense), and no index ranks such near-ties as an exact scan does.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from psycopg import sql

from pipeline.publish import search as found
from pipeline.publish.index import Index
from pipeline.publish.names import Names
from pipeline.settings.steps import run_settings
from tests.bench.corpus import make_documents

QUERIES = 100          # each mode's SQL part
COMMANDS = 10          # each mode's whole command (a process each)
HYBRID_SQL_MS, RECALL = 30.0, 0.95


def queries(n: int = QUERIES, seed: int = 98) -> list[str]:
    """N queries of two or three consecutive words of fresh documents."""
    rng = np.random.default_rng(seed)
    out = []
    for doc in make_documents(n * 3, seed=seed):
        words = [w for w in doc["text"].split() if w.isalpha()]
        if len(words) < 4:
            continue
        size = int(rng.integers(2, 4))
        start = int(rng.integers(0, len(words) - size))
        out.append(" ".join(words[start:start + size]))
        if len(out) == n:
            break
    return out


def _vector(v: np.ndarray) -> str:
    return "[" + ",".join(repr(float(x)) for x in v) + "]"


def _cpu_s(pid: int) -> float:
    """The CPU seconds (user and system) process PID has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def sql_part(server, db: str, name: str, words: list[str], vectors: np.ndarray, dims: int) -> dict[str, list]:
    """Per mode, the ms of each query's statement (found.run, as search runs it) and the mean ms
    of the server process's CPU per query (`MODE cpu`); the rows each query's words match."""
    settings = run_settings(None)
    publish, search = settings.publish, settings.search
    names, index = Names("public", name), Index(dims)
    expr = sql.SQL("%(query)s::vector({})").format(sql.Literal(dims))
    with server.connect(db) as conn:
        config = conn.execute("SELECT record->>'text_search' FROM embedpipe_published WHERE name = %s",
                              (name,)).fetchone()[0]
        times: dict[str, list] = {"matched": [conn.execute(sql.SQL(
            "SELECT count(*) FROM {} WHERE text_tsv @@ websearch_to_tsquery(%s::regconfig, %s)").format(names()),
            (config, text)).fetchone()[0] for text in words]}
        for mode in ("hybrid", "text", "vector"):
            times[mode] = []
            cpu = _cpu_s(conn.info.backend_pid)
            for text, vec in zip(words, vectors, strict=True):
                q = found.Query(10, None if mode == "text" else expr, None if mode == "vector" else text, config)
                started = time.perf_counter()
                found.run(conn, names, index, [], q, {"query": _vector(vec)}, publish, search)
                times[mode].append(1000 * (time.perf_counter() - started))
            times[f"{mode} cpu"] = [1000 * (_cpu_s(conn.info.backend_pid) - cpu) / len(words)]
    return times


def vector_leg(server, db: str, name: str, vectors: np.ndarray, dims: int) -> list[list[str]]:
    """The chunk ids `search --mode vector` returns for each of VECTORS."""
    settings = run_settings(None)
    expr = sql.SQL("%(query)s::vector({})").format(sql.Literal(dims))
    with server.connect(db) as conn:
        return [[r[len(found.OWN)] for r in found.run(conn, Names("public", name), Index(dims), [],
                                                     found.Query(10, expr, None), {"query": _vector(v)},
                                                     settings.publish, settings.search)] for v in vectors]


def exact(server, db: str, name: str, vectors: np.ndarray) -> list[list[float]]:
    """Each query's ten nearest distances by an exact scan (no index)."""
    with server.connect(db, prepare_threshold=None) as conn:
        conn.execute("SET enable_indexscan = off")
        return [[r[0] for r in conn.execute(sql.SQL("SELECT embedding <=> %s::vector FROM {} ORDER BY 1 LIMIT 10")
                                              .format(sql.Identifier(name)), (_vector(v),))] for v in vectors]


def recall(server, db: str, name: str, vectors: np.ndarray, ids: list[list[str]], want: list[list[float]]) -> float:
    """The vector leg's recall@10: a hit counts when no farther than the exact scan's tenth
    (chunks of equal text have equal vectors: which of a tie comes back is arbitrary)."""
    got = []
    with server.connect(db) as conn:
        for v, chunk_ids in zip(vectors, ids, strict=True):
            got.append([r[0] for r in conn.execute(sql.SQL("SELECT embedding <=> %s::vector FROM {} WHERE chunk_id "
                                                           "= ANY(%s)").format(sql.Identifier(name)),
                                                   (_vector(v), chunk_ids))])
    return statistics.mean(sum(d <= w[-1] + 1e-9 for d in g) / len(w) for g, w in zip(got, want, strict=True))


def commands(bench, sb, url: str, out: Path, name: str, words: list[str]) -> dict[str, float]:
    """Per mode, the p50 wall ms of the whole command, COMMANDS queries each; `start` the p50 of
    `python -m pipeline --version`, the interpreter's and the package's start alone."""
    from tests.bench.run_bench import _env
    walls: dict[str, list[float]] = {"hybrid": [], "text": [], "vector": [], "start": []}
    for _ in range(COMMANDS):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "pipeline", "--version"], env=_env(), capture_output=True, check=True)
        walls["start"].append(1000 * (time.perf_counter() - started))
    for text in words[:COMMANDS]:
        for mode in ("hybrid", "text", "vector"):
            started = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "pipeline", "search", str(out), text, "--mode", mode,
                                   "--to", url, "--table", name, "--base-url", sb.base_url, "--json"],
                                  env=_env(), capture_output=True, text=True, timeout=120)
            walls[mode].append(1000 * (time.perf_counter() - started))
            if done.returncode != 0 or len(json.loads(done.stdout)["results"]) == 0 and mode != "text":
                raise SystemExit(f"search --mode {mode} {text!r} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return {mode: statistics.median(w) for mode, w in walls.items()}


def run(bench, sb, server, db: str, name: str, out: Path, vectors_of, passages: np.ndarray, dims: int) -> None:
    """The figures, as one target line (VECTORS_OF: the sandbox's vectors of a list of texts;
    PASSAGES: the vectors of the recall's queries)."""
    words = queries()
    bench.say(f"  search's modes, {len(words)} queries ...")
    times = sql_part(server, db, name, words, vectors_of(words), dims)
    got = recall(server, db, name, passages, vector_leg(server, db, name, passages, dims),
                 exact(server, db, name, passages))
    whole = commands(bench, sb, server.url(db), out, name, words)
    p50 = {mode: statistics.median(times[mode]) for mode in ("hybrid", "text", "vector")}
    cap = run_settings(None).search.text_rank_rows
    over = sum(m > cap for m in times["matched"])
    bench.targets.append(
        f"search on the {name} table, {len(words)} queries of 2-3 words, p50 ms SQL / whole command "
        f"({COMMANDS} processes): hybrid {p50['hybrid']:.1f} / {whole['hybrid']:.0f}, text {p50['text']:.1f} / "
        f"{whole['text']:.0f}, vector {p50['vector']:.1f} / {whole['vector']:.0f}, of which the start of "
        f"`python -m pipeline` {whole['start']:.0f} (target: hybrid SQL <= {HYBRID_SQL_MS:.0f} ms); the server's "
        f"CPU per query, mean: hybrid {times['hybrid cpu'][0]:.1f}, text {times['text cpu'][0]:.1f}, vector "
        f"{times['vector cpu'][0]:.1f} ms; hybrid p95 {float(np.percentile(times['hybrid'], 95)):.1f} ms; the "
        f"vector leg's recall@10 on {len(passages)} passages {got:.3f} (target >= {RECALL}) at ef_search "
        f"{run_settings(None).publish.ef_search}; rows matching a query's words, median "
        f"{statistics.median(times['matched']):,.0f}, {over} of {len(words)} above text_rank_rows ({cap:,}: "
        f"ranked among the first {cap:,})")
