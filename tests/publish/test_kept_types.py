"""A kept column whose type changes between runs: a lossless widening takes the wider type for
the whole view (older rows cast at the commit, nothing paid) and the table follows it; an input
narrower than the view is cast up to the view's type; any other change is refused by run and
plan before anything is sent, in one line naming the column and both types."""
from __future__ import annotations

import json
import struct

import psycopg
from psycopg import sql
import pyarrow as pa
import pyarrow.parquet as pq

from tests.e2e.money_helpers import corpus_rows
from tests.publish.helpers import publish



def f32(value: float) -> float:
    """VALUE rounded to a float32, as a Python float (the float64 of the same value)."""
    return struct.unpack("f", struct.pack("f", value))[0]


def write(path, rows, fields: dict) -> None:
    """ROWS (id, text, and the values of FIELDS) as Parquet, FIELDS: name -> Arrow type."""
    schema = pa.schema([("id", pa.string()), ("text", pa.string()), *fields.items()])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)


def docs(n: int, **values) -> list[dict]:
    rows = corpus_rows(n_short=n, n_long=0)[:n]
    return [{**r, **{k: v(i) for k, v in values.items()}} for i, r in enumerate(rows)]


def view_types(out) -> set[tuple]:
    """The kept columns' types of every file of the view (one set: one schema)."""
    found = set()
    for kind in ("embeddings", "pending"):
        for f in (out / "current").glob(f"{kind}-*.parquet"):
            schema = pq.read_schema(f)
            found.add(tuple((n, str(schema.field(n).type)) for n in ("num", "x") if n in schema.names))
    return found


def bits(value: float) -> bytes:
    return struct.pack(">d", value)


def published(url: str, columns=("num", "x")) -> dict:
    """doc_id -> (COLUMNS' values), read in binary: a real arrives as its float32 value, not as text."""
    query = sql.SQL("SELECT doc_id, {} FROM embeddings WHERE chunk_index = 0").format(
        sql.SQL(", ").join(map(sql.Identifier, columns)))
    with psycopg.connect(url) as conn, conn.cursor(binary=True) as cur:
        cur.execute(query)
        return {d: tuple(values) for d, *values in cur}


def test_a_widened_kept_column_widens_the_view_and_the_table(days, pg_url, tmp_path):
    day1 = docs(6, num=lambda i: i, x=lambda i: f32(0.1 * i))
    write(tmp_path / "d1.parquet", day1, {"num": pa.int32(), "x": pa.float32()})
    assert days.run_file(tmp_path / "d1.parquet", "--keep-columns", "num,x") == 0
    assert publish(days.out, pg_url) == 0
    paid = days.sandbox_ledger()
    day2 = day1 + [{"id": "big", "text": "a new document, with a value past int32", "num": 2 ** 40, "x": 0.1}]
    write(tmp_path / "d2.parquet", day2, {"num": pa.int64(), "x": pa.float64()})
    assert days.run_file(tmp_path / "d2.parquet", "--keep-columns", "num,x", "--sync") == 0
    assert len(days.sandbox_ledger()) == len(paid) + 1   # the new document only
    assert view_types(days.out) == {(("num", "int64"), ("x", "double"))}
    assert publish(days.out, pg_url) == 0
    rows = published(pg_url)
    assert rows["big"][0] == 2 ** 40 and bits(rows["big"][1]) == bits(0.1)
    for i, r in enumerate(day1):
        assert rows[r["id"]][0] == i and bits(rows[r["id"]][1]) == bits(f32(0.1 * i))
    with psycopg.connect(pg_url) as conn:
        types = dict(conn.execute("SELECT column_name, data_type FROM information_schema.columns "
                                  "WHERE table_name = 'embeddings' AND column_name IN ('num', 'x')").fetchall())
    assert types == {"num": "bigint", "x": "double precision"}


def as_made_before(out, day1_run: str) -> None:
    """DIR as a run made it before views kept their types: the manifests without them, and the
    first run's files of the view holding `num` as int32 (written in place: the view's links
    are hard links to them)."""
    for manifest in [out / "_current.json", *out.glob("_views/*.json")]:
        doc = json.loads(manifest.read_text())
        doc.pop("kept_types", None)
        manifest.write_text(json.dumps(doc))
    for path in (out / "history" / day1_run).glob("embeddings-*.parquet"):
        table = pq.read_table(path)
        at = table.schema.get_field_index("num")
        pq.write_table(table.set_column(at, table.schema.field(at).with_type(pa.int32()),
                                        table.column(at).cast(pa.int32())), path)


def test_a_view_of_two_types_made_before_publishes_their_join_and_the_next_run_makes_it_one(days, pg_url, tmp_path,
                                                                                            capsys):
    day1 = docs(5, num=lambda i: i)
    write(tmp_path / "d1.parquet", day1, {"num": pa.int64()})
    assert days.run_file(tmp_path / "d1.parquet", "--keep-columns", "num") == 0
    first = json.loads((days.out / "summary.json").read_text())["run_id"]
    day2 = day1 + [{"id": "big", "text": "a new document, with a value past int32", "num": 2 ** 40}]
    write(tmp_path / "d2.parquet", day2, {"num": pa.int64()})
    assert days.run_file(tmp_path / "d2.parquet", "--keep-columns", "num", "--sync") == 0
    as_made_before(days.out, first)
    assert len(view_types(days.out)) == 2   # int32 and int64 files in one view
    assert publish(days.out, pg_url) == 0
    assert {d: n for d, (n,) in published(pg_url, ("num",)).items()} == {r["id"]: r["num"] for r in day2}
    assert days.run_file(tmp_path / "d2.parquet", "--keep-columns", "num", "--sync") == 0   # nothing changed
    assert view_types(days.out) == {(("num", "int64"),)}
    assert json.loads((days.out / "_current.json").read_text())["kept_types"]
