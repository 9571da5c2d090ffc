"""`search` on the larger published table (docs/BENCH.md, "Publishing to PostgreSQL"): p50 of each
mode, the SQL part (the statement search runs, with its settings, on one warm connection:
pipeline/publish/search.py) and the whole command (`python -m pipeline search ... --json`, a
child process: the interpreter's start, the query's request to the sandbox, the statement, the
output); the vector leg's recall@10 against an exact scan; how many matching rows the text leg
scored.

The queries are what users type: two or three consecutive words of passages not in the corpus
(prose, code and Russian as the corpus mixes them), so some words are rare and some in most rows.
"""
from __future__ import annotations

import json
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


def sql_part(server, db: str, name: str, words: list[str], vectors: np.ndarray, dims: int) -> dict[str, list]:
    """Per mode, the ms of each query's statement (found.run, as search runs it), and the vector
    leg's chunk ids."""
    settings = run_settings(None)
    publish, search = settings.publish, settings.search
    names, index = Names("public", name), Index(dims)
    with server.connect(db) as conn:
        config = conn.execute("SELECT record->>'text_search' FROM embedpipe_published WHERE name = %s",
                              (name,)).fetchone()[0]
        kept = []
        times: dict[str, list] = {"hybrid": [], "text": [], "vector": [], "ids": [], "matched": []}
        for text, vec in zip(words, vectors, strict=True):
            expr = sql.SQL("%(query)s::vector({})").format(sql.Literal(dims))
            params = {"query": _vector(vec)}
            for mode in ("hybrid", "text", "vector"):
                q = found.Query(10, None if mode == "text" else expr, None if mode == "vector" else text, config)
                started = time.perf_counter()
                rows = found.run(conn, names, index, kept, q, params, publish, search)
                times[mode].append(1000 * (time.perf_counter() - started))
                if mode == "vector":
                    times["ids"].append([r[len(found.OWN)] for r in rows])
            times["matched"].append(conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE text_tsv @@ "
                                                         "websearch_to_tsquery(%s::regconfig, %s)").format(
                names()), (config, text)).fetchone()[0])
    return times


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


def run(bench, sb, server, db: str, name: str, out: Path, vectors_of, dims: int) -> None:
    """The figures, as one target line (VECTORS_OF: the sandbox's vectors of a list of texts)."""
    words = queries()
    vectors = vectors_of(words)
    bench.say(f"  search's modes, {len(words)} queries ...")
    times = sql_part(server, db, name, words, vectors, dims)
    got = recall(server, db, name, vectors, times["ids"], exact(server, db, name, vectors))
    whole = commands(bench, sb, server.url(db), out, name, words)
    p50 = {mode: statistics.median(times[mode]) for mode in ("hybrid", "text", "vector")}
    cap = run_settings(None).search.text_rank_rows
    over = sum(m > cap for m in times["matched"])
    bench.targets.append(
        f"search on the {name} table, {len(words)} queries of 2-3 words, p50 ms SQL / whole command "
        f"({COMMANDS} processes): hybrid {p50['hybrid']:.1f} / {whole['hybrid']:.0f}, text {p50['text']:.1f} / "
        f"{whole['text']:.0f}, vector {p50['vector']:.1f} / {whole['vector']:.0f}, of which the start of "
        f"`python -m pipeline` {whole['start']:.0f} (target: hybrid SQL <= "
        f"{HYBRID_SQL_MS:.0f} ms); hybrid p95 {float(np.percentile(times['hybrid'], 95)):.1f} ms; vector leg "
        f"recall@10 {got:.3f} (target >= {RECALL}) at ef_search {run_settings(None).publish.ef_search}; matching rows per "
        f"query median {statistics.median(times['matched']):,.0f}, {over} of {len(words)} above text_rank_rows "
        f"({cap:,}: ranked among the first {cap:,})")
