"""Reading both sides of a publish: DIR's current view and the published table, row by row."""
from __future__ import annotations

import decimal
import json
import time
from pathlib import Path

import numpy as np
import psycopg
import pyarrow.parquet as pq
from psycopg import sql

from pipeline.cli import main

KEY = ("doc_id", "chunk_index", "token_start")


def publish(out: Path, target: str, *extra: str) -> int:
    return main(["publish", str(out), "--to", target, *extra])


def relation(table: str) -> sql.Identifier:
    """TABLE, or SCHEMA.TABLE, quoted."""
    return sql.Identifier(*table.split("."))


def published(capsys, out: Path, url: str, *extra: str) -> dict:
    """publish --json: its report."""
    capsys.readouterr()
    assert publish(out, url, "--json", *extra) == 0
    return json.loads(capsys.readouterr().out)


def view_rows(out: Path) -> dict[tuple, dict]:
    """DIR/current/embeddings-* by key; the vector as its float32 bytes."""
    files = sorted((out / "current").glob("embeddings-*.parquet"))
    rows = {}
    for f in files:
        for r in pq.read_table(f).to_pylist():
            r["embedding"] = np.asarray(r["embedding"], dtype=np.float32).tobytes()
            rows[tuple(r[k] for k in KEY)] = r
    return rows


def table_rows(url: str, table: str = "embeddings") -> dict[tuple, dict]:
    """The published relation by key; the vector as float32 bytes from pgvector's binary form."""
    with psycopg.connect(url) as conn:
        cur = conn.execute(sql.SQL("SELECT *, vector_send(embedding) AS _bytes FROM {}").format(relation(table)))
        names = [d.name for d in cur.description]
        rows = {}
        for values in cur:
            r = dict(zip(names, values, strict=True))
            raw = bytes(r.pop("_bytes"))
            r["embedding"] = np.frombuffer(raw[4:], dtype=">f4").astype(np.float32).tobytes()
            rows[tuple(r[k] for k in KEY)] = r
        return rows


def assert_same(out: Path, url: str, table: str = "embeddings") -> int:
    """The table is DIR's current view, row for row and bit for bit, a text the view lacks (a
    null, or a file without the column) empty; the number of rows."""
    view, published = view_rows(out), table_rows(url, table)
    assert view.keys() == published.keys()
    for key, want in view.items():
        got = published[key]
        for column, value in {**want, "text": want.get("text") or ""}.items():
            have = got[column]
            if isinstance(have, decimal.Decimal):
                have = float(have)
            assert have == value, (key, column, have, value)
    return len(view)


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def tuples_written(url: str) -> dict[str, int]:
    """What the served data table took so far, as pg_stat_user_tables counts it (inserts,
    updates, of them HOT ones, deletes), once every publishing backend has ended (a backend
    flushes its counts before it leaves pg_stat_activity)."""
    with psycopg.connect(url, autocommit=True) as conn:
        for _ in range(300):
            if not conn.execute("SELECT 1 FROM pg_stat_activity WHERE application_name LIKE 'embedpipe publish%' "
                                "AND pid <> pg_backend_pid()").fetchall():
                break
            time.sleep(0.1)
        else:
            raise AssertionError("a publishing backend is still there")
        data = conn.execute("SELECT record->>'data_table' FROM embedpipe_published").fetchone()[0]
        found = conn.execute("SELECT n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables "
                             "WHERE relname = %s", (data,)).fetchone()
    return dict(zip(("inserted", "updated", "hot", "deleted"), found, strict=True)) | {"table": data}
