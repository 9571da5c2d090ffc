"""PostgreSQL for the publish section (tests/bench/publish.py): one embedded server (with the
settings `--to embedded` gives it), the ways in that the publish is set against, and what the
server shows while it runs.

The floor: the view's rows read with pyarrow, bare `COPY ... (FORMAT BINARY)` (psycopg 3 and
pgvector-python's binary vector), two at once as the publish's workers, with each chunk's text
into an unindexed table (the publish's
fillfactor) whose generated tsvector of the text the server computes as it takes the rows
(publish.text_search_config), then the GIN index of it and the HNSW build, with the publish's
own settings. The day-2 floor: the day's changed rows applied to that table, its GIN, HNSW and
key indexes, by bare SQL in one transaction. The peer: langchain-postgres
`PGVector.add_embeddings` of the same vectors, texts, ids and lineage (as metadata), batch by
batch as its docs show it, in a process of its own
(`python -m tests.bench.postgres URL OUT DIMS RESULT_JSON`: PGVector makes its table class once
per process, for one vector length), then the same index on its table. From the server: when
an HNSW index is built (pg_stat_progress_create_index), the rows each table took
(pg_stat_user_tables), readers polling a table, and search against an exact scan.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import psycopg
import yaml
from psycopg import sql

KEY = ["doc_id", "chunk_index", "token_start"]
COLUMNS = [*KEY, "token_end", "n_tokens", "text_sha256", "text", "model", "request_id", "cost_rub", "run_id",
           "embedded_at"]
TYPES = ["text", "int4", "int4", "int4", "int4", "text", "text", "text", "text", "float8", "text", "timestamptz"]
LINEAGE = [c for c in COLUMNS[3:] if c != "text"]   # the peer's metadata
PEER_BATCH = 1000          # rows per add_embeddings call: one INSERT of 5 parameters a row (65,535 at most)
STREAMS = 2                # the floor's COPY streams at once: the publish's workers (configs/profiles/local.yaml);
                           # the server computes each row's tsvector, most of a COPY's work with the text

def index_settings() -> dict:
    """The publish's index build and search settings (configs/pipeline.yaml, `publish:`);
    pgvector's and PostgreSQL's defaults where it names none."""
    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / "configs" / "pipeline.yaml").read_text()) or {}
    pub = doc.get("publish") or {}
    return {"m": int(pub.get("hnsw_m", 16)), "ef_construction": int(pub.get("hnsw_ef_construction", 64)),
            "maintenance_work_mem": f"{int(pub.get('maintenance_work_mem_mb', 64))}MB",
            "workers": int(pub.get("parallel_index_workers", 2)), "ef_search": int(pub.get("ef_search", 40)),
            "fillfactor": int(pub.get("fillfactor", 100)), "text_search": str(pub.get("text_search_config", "simple"))}


def index_sql(table: str, dims: int, s: dict) -> sql.Composed:
    column = (sql.SQL("(embedding::halfvec({})) halfvec_cosine_ops").format(sql.Literal(dims)) if dims > 2000
              else sql.SQL("embedding vector_cosine_ops"))
    return sql.SQL("CREATE INDEX ON {} USING hnsw ({}) WITH (m = {}, ef_construction = {})").format(
        sql.Identifier(table), column, sql.Literal(s["m"]), sql.Literal(s["ef_construction"]))


# -- the server -------------------------------------------------------------------------------

class Server:
    """One embedded server for the section, made and started as `--to embedded` makes and starts it
    (its settings too); URL per database (no password: peer authentication over its socket)."""

    def __init__(self, data: Path):
        from pipeline.publish.embedded import installed, server_settings   # the postgres extra's programs
        from pipeline.publish.embedded_server import Cluster
        from pipeline.publish.embedded_user import account_for, check_reach
        from pipeline.settings.steps import run_settings
        account, programs = account_for(data), installed()[1]
        check_reach(account, data, programs)
        cluster = Cluster(data, account, programs)
        cluster.make()
        self._serving = contextlib.ExitStack()
        self.socket = self._serving.enter_context(cluster.serving(server_settings(run_settings(None).publish)))
        try:
            self.version = self.query("postgres", "SELECT current_setting('server_version'), "
                                                  "(SELECT default_version FROM pg_available_extensions "
                                                  "WHERE name = 'vector'), current_setting('shared_buffers')")[0]
        except BaseException:
            self.stop()
            raise

    def url(self, db: str, driver: str = "") -> str:
        return f"postgresql{'+' + driver if driver else ''}://postgres@/{db}?host={self.socket}"

    def connect(self, db: str, **kwargs):
        from pgvector.psycopg import register_vector   # the bench extra's
        conn = psycopg.connect(self.url(db), autocommit=True, **kwargs)
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        register_vector(conn)
        return conn

    def query(self, db: str, statement: str, params=()) -> list:
        with self.connect(db) as conn:
            return conn.execute(statement, params).fetchall()

    def fresh_db(self, db: str) -> str:
        with self.connect("postgres") as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db)))
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db)))
        return db

    def drop_db(self, db: str) -> None:
        with self.connect("postgres") as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db)))

    def stop(self) -> None:
        self._serving.close()


# -- the view ---------------------------------------------------------------------------------

def view_bytes(out: Path) -> tuple[int, int] | None:
    """(bytes of OUT's current embeddings files, of their text column's pages); None without the view."""
    files = view_files(out)
    if not files:
        return None
    text = 0
    for f in files:
        meta = pq.read_metadata(f)
        names = [meta.schema.column(i).path for i in range(meta.num_columns)]
        if "text" in names:
            column = names.index("text")
            text += sum(meta.row_group(g).column(column).total_compressed_size for g in range(meta.num_row_groups))
    return sum(f.stat().st_size for f in files), text


def view_files(out: Path) -> list[Path]:
    return sorted((out / "current").glob("embeddings-*.parquet"))


def read_view(out: Path, columns=(*COLUMNS, "embedding")) -> pa.Table:
    return pa.concat_tables(pq.read_table(f, columns=list(columns)) for f in view_files(out))


def vectors(t: pa.Table) -> np.ndarray:
    col = t.column("embedding").combine_chunks()
    return col.values.to_numpy().reshape(len(col), col.type.list_size)


# -- the three ways in --------------------------------------------------------------------------

@dataclasses.dataclass
class Way:
    name: str
    load_s: float
    index_s: float
    whole_s: float
    peak_rss_mb: float | None = None
    rows_written: int | None = None
    written: np.ndarray | None = None   # inserted, updated, deleted, HOT updates of all tables


def floor(server: Server, out: Path, dims: int, s: dict, keep: bool = False) -> Way:
    """KEEP: the database bench_floor stays, its table with the key's unique index added (not
    timed), for day2_floor."""
    db = server.fresh_db("bench_floor")
    started = time.perf_counter()
    t = read_view(out)
    read_s = time.perf_counter() - started
    vecs, cols = vectors(t), [t.column(c).to_pylist() for c in COLUMNS]
    with server.connect(db) as conn:
        defs = [sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(ty))
                for c, ty in zip(COLUMNS, TYPES, strict=True)]
        conn.execute(sql.SQL("CREATE TABLE floor ({}, embedding vector({}), text_tsv tsvector GENERATED ALWAYS AS "
                             "(to_tsvector({}::regconfig, text)) STORED) WITH (fillfactor = {})").format(
            sql.SQL(", ").join(defs), sql.Literal(dims), sql.Literal(s["text_search"]), sql.Literal(s["fillfactor"])))
        rows = list(zip(*cols, vecs, strict=True))
        shares = [rows[i::STREAMS] for i in range(STREAMS)]
        with concurrent.futures.ThreadPoolExecutor(STREAMS) as pool:
            list(pool.map(lambda share: copy_rows(server, db, share), shares))
        load_s = time.perf_counter() - started
        gin_s = build_gin(conn, "floor", s)
        hnsw_s = build_index(conn, "floor", dims, s)
        check_count(conn, "floor", t.num_rows)
        if keep:
            conn.execute(sql.SQL("CREATE UNIQUE INDEX ON floor ({})").format(sql.SQL(", ").join(map(sql.Identifier, KEY))))
    if not keep:
        server.drop_db(db)
    return Way(f"floor: read {read_s:.1f} s, COPY BINARY {load_s - read_s:.1f} s, GIN {gin_s:.1f} s, HNSW",
               load_s, gin_s + hnsw_s, load_s + gin_s + hnsw_s)


def copy_rows(server: Server, db: str, rows: list[tuple]) -> None:
    """ROWS into floor by one binary COPY, over a connection of its own."""
    with server.connect(db) as conn, conn.cursor() as cur, cur.copy(sql.SQL(
            "COPY floor ({}, embedding) FROM STDIN (FORMAT BINARY)").format(
            sql.SQL(", ").join(map(sql.Identifier, COLUMNS)))) as copy:
        copy.set_types([*TYPES, "vector"])
        for row in rows:
            copy.write_row(row)


def day2_floor(server: Server, before: pa.Table, after: pa.Table, dims: int, warm: np.ndarray,
               ef_search: int) -> tuple[float, int]:
    """The day's change (BEFORE's rows to AFTER's) applied to floor's table of BEFORE (kept) as
    bare SQL in one transaction: the changed rows by binary COPY into a temp table, then one
    UPDATE ... FROM, one DELETE, one INSERT ... SELECT; timed from the COPY to the commit, after
    the WARM queries (the search the published table served). (seconds, rows written)"""
    old = {r[:3]: r for r in zip(*(before.column(c).to_pylist() for c in COLUMNS), strict=True)}
    new = zip(*(after.column(c).to_pylist() for c in COLUMNS), vectors(after), strict=True)
    day = [("u" if r[:3] in old else "i", *r) for r in new if old.get(r[:3]) != r[:-1]]
    kept = {r[:3] for r in zip(*(after.column(c).to_pylist() for c in KEY), strict=True)}
    day += [("d", *r[:3], *[None] * (len(COLUMNS) - 2)) for k, r in old.items() if k not in kept]
    names = sql.SQL(", ").join(map(sql.Identifier, COLUMNS))
    key = sql.SQL(" AND ").join(sql.SQL("f.{k} = d.{k}").format(k=sql.Identifier(k)) for k in KEY)
    rest = [*COLUMNS[3:], "embedding"]
    with server.connect("bench_floor") as conn:
        conn.execute(sql.SQL("SET hnsw.ef_search = {}").format(sql.Literal(ef_search)))
        for q in warm:
            conn.execute("SELECT 1 FROM floor ORDER BY embedding <=> %s LIMIT 10", (q,)).fetchall()
        started = time.perf_counter()
        with conn.transaction():
            conn.execute(sql.SQL("CREATE TEMP TABLE day (op text, {}, embedding vector({})) ON COMMIT DROP").format(
                sql.SQL(", ").join(sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(t))
                                   for c, t in zip(COLUMNS, TYPES, strict=True)), sql.Literal(dims)))
            with conn.cursor() as cur, cur.copy(sql.SQL("COPY day (op, {}, embedding) FROM STDIN (FORMAT BINARY)")
                                                .format(names)) as copy:
                copy.set_types(["text", *TYPES, "vector"])
                for row in day:
                    copy.write_row(row)
            written = [conn.execute(statement).rowcount for statement in (
                sql.SQL("UPDATE floor f SET ({}) = ROW({}) FROM day d WHERE d.op = 'u' AND {}").format(
                    sql.SQL(", ").join(map(sql.Identifier, rest)),
                    sql.SQL(", ").join(sql.SQL("d.{}").format(sql.Identifier(c)) for c in rest), key),
                sql.SQL("DELETE FROM floor f USING day d WHERE d.op = 'd' AND {}").format(key),
                sql.SQL("INSERT INTO floor ({}, embedding) SELECT {}, embedding FROM day WHERE op = 'i'").format(
                    names, names))]
        took = time.perf_counter() - started
        check_count(conn, "floor", after.num_rows)
    if sum(written) != len(day):
        raise SystemExit(f"the day-2 floor wrote {sum(written):,} rows of {len(day):,}")
    server.drop_db("bench_floor")
    return took, len(day)


def check_count(conn, table: str, want: int) -> None:
    got = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))).fetchone()[0]
    if got != want:
        raise SystemExit(f"{table} holds {got:,} rows, the view {want:,}")


def build_gin(conn, table: str, s: dict) -> float:
    """The GIN index of TABLE's text_tsv, with the HNSW build's memory."""
    conn.execute(sql.SQL("SET maintenance_work_mem = {}").format(sql.Literal(s["maintenance_work_mem"])))
    conn.execute(sql.SQL("SET max_parallel_maintenance_workers = {}").format(sql.Literal(s["workers"])))
    started = time.perf_counter()
    conn.execute(sql.SQL("CREATE INDEX ON {} USING gin (text_tsv)").format(sql.Identifier(table)))
    return time.perf_counter() - started


def build_index(conn, table: str, dims: int, s: dict) -> float:
    conn.execute(sql.SQL("SET maintenance_work_mem = {}").format(sql.Literal(s["maintenance_work_mem"])))
    conn.execute(sql.SQL("SET max_parallel_maintenance_workers = {}").format(sql.Literal(s["workers"])))
    started = time.perf_counter()
    conn.execute(index_sql(table, dims, s))
    return time.perf_counter() - started


def peer_load(url: str, out: Path, dims: int) -> float:
    """The view's vectors, ids and lineage through PGVector.add_embeddings, batch by batch."""
    from langchain_core.embeddings import FakeEmbeddings   # never called: the vectors are given
    from langchain_postgres import PGVector

    store = PGVector(FakeEmbeddings(size=dims), connection=url, embedding_length=dims, collection_name="view",
                     use_jsonb=True)
    started = time.perf_counter()
    for f in view_files(out):
        for batch in pq.ParquetFile(f).iter_batches(PEER_BATCH, columns=[*COLUMNS, "embedding"]):
            meta = batch.select(LINEAGE).to_pylist()
            ids = [f"{d}/{i}/{t}" for d, i, t in zip(*(batch.column(c).to_pylist() for c in KEY), strict=True)]
            store.add_embeddings(texts=batch.column("text").to_pylist(),
                                 embeddings=vectors(pa.Table.from_batches([batch])).tolist(),
                                 metadatas=[{**m, "embedded_at": m["embedded_at"].isoformat()} for m in meta],
                                 ids=ids)
    return time.perf_counter() - started


class IndexWatch:
    """When the server builds the GIN and HNSW indexes in DB: the first and last time
    pg_stat_progress_create_index shows a CREATE INDEX ... USING gin or hnsw (polled every 20 ms)."""

    def __init__(self, server: Server, db: str):
        self._conn, self._db = server.connect("postgres"), db
        self.seen: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            if self._conn.execute("SELECT 1 FROM pg_stat_progress_create_index p JOIN pg_stat_activity a "
                                  "USING (pid) WHERE p.datname = %s AND (a.query ILIKE '%%hnsw%%' OR "
                                  "a.query ILIKE '%%using gin%%')",
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
    """Each user table's name and rows inserted, updated, deleted, and of the updates those
    that were HOT (no new index entry), so far, by its oid."""
    with server.connect(db) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        return {oid: (name, np.array(n)) for oid, name, *n in conn.execute(
            "SELECT relid, relname, n_tup_ins, n_tup_upd, n_tup_del, n_tup_hot_upd FROM pg_stat_user_tables")
            .fetchall()}


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

    def _loop(self, statement: sql.Composed, params, check, pause: float) -> None:
        with self.server.connect(self.db) as conn:
            while not self._stop.is_set():
                started = time.perf_counter()
                try:
                    rows = conn.execute(statement, params).fetchall()
                except Exception as e:   # any: a reader's failure is the figure
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
        self._loop(sql.SQL("SELECT model FROM {} ORDER BY embedding <=> %s LIMIT 10").format(
            sql.Identifier(self.name)), (self.query,), check, 0.02)

    def _whole(self) -> None:
        def check(started, ended, rows):
            self.mixed += len(rows) != 1 or rows[0][1] not in self.counts
        self._loop(sql.SQL("SELECT model, count(*) FROM {} GROUP BY model").format(sql.Identifier(self.name)), (),
                   check, 0.2)

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
            rows = conn.execute(sql.SQL("SELECT embedding <=> %s FROM {} ORDER BY embedding <=> %s LIMIT 10")
                                .format(sql.Identifier(name)), (q, q)).fetchall()
            took.append(1000 * (time.perf_counter() - started))
            found.append([r[0] for r in rows])
        return found, took

    # unprepared statements, as psql sends them: a prepared statement's plan outlives a SET
    with server.connect(db, prepare_threshold=None) as conn:
        run(conn)   # warm the cache
        conn.execute("SET enable_indexscan = off")
        plan = "\n".join(r[0] for r in conn.execute(sql.SQL("EXPLAIN SELECT 1 FROM {} ORDER BY embedding <=> %s "
                                                              "LIMIT 10").format(sql.Identifier(name)),
                                                      (queries[0],)).fetchall())
        if "Index" in plan:
            raise SystemExit(f"the exact scan uses an index:\n{plan}")
        exact, exact_ms = run(conn)
        conn.execute("RESET enable_indexscan")
        rows = [["exact scan", statistics.median(exact_ms),
                 float(np.percentile(exact_ms, 95)), 1.0]]
        for ef in efs:
            conn.execute(sql.SQL("SET hnsw.ef_search = {}").format(sql.Literal(ef)))
            found, took = run(conn)
            recall = statistics.mean(sum(d <= e[-1] + 1e-9 for d in f) / len(e) for f, e in zip(found, exact, strict=True))
            rows.append([f"ef_search {ef}", statistics.median(took), float(np.percentile(took, 95)), recall])
    return rows


if __name__ == "__main__":   # the peer's load: URL OUT DIMS RESULT_JSON
    _url, _out, _dims, _result = sys.argv[1:]
    Path(_result).write_text(json.dumps({"load_s": peer_load(_url, Path(_out), int(_dims))}))
