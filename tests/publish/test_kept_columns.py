"""Kept columns of every Arrow type an input can give them: each publishes exactly (its values
read back equal to the view's, floats bit for bit, decimals digit for digit), or the publish
is refused in one line naming the column, before anything is written."""
from __future__ import annotations

import datetime as dt
import decimal
import math
import re
import struct

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.e2e.money_helpers import corpus_rows
from tests.publish.helpers import publish, table_rows, view_rows

UTC = dt.UTC
D = decimal.Decimal
# name -> (Arrow type, values cycled over the documents; None is a null)
EXACT = {
    "i8": (pa.int8(), [-128, 127, None]), "i16": (pa.int16(), [-32768, 32767]),
    "i32": (pa.int32(), [-2 ** 31, 2 ** 31 - 1]), "i64": (pa.int64(), [-2 ** 63, 2 ** 63 - 1, None]),
    "u8": (pa.uint8(), [0, 255]), "u16": (pa.uint16(), [65535, None]), "u32": (pa.uint32(), [2 ** 32 - 1, 7]),
    "u64": (pa.uint64(), [2 ** 64 - 1, 0, None]),
    "f16": (pa.float16(), [0.0999755859375, 65504.0, -0.0, math.inf, None]),
    "f32": (pa.float32(), [struct.unpack("f", struct.pack("f", 0.1))[0], 3.4028234663852886e38, math.nan, None]),
    "f64": (pa.float64(), [0.1, 1e308, -0.0, math.nan, -math.inf, 5e-324]),
    "flag": (pa.bool_(), [True, False, None]),
    "s": (pa.string(), ["", "ünï cødé ✓", None]), "ls": (pa.large_string(), ["large", None]),
    'a "quoted" Name; ✓': (pa.string(), ["any name SQL quotes", None]),
    "ds": (pa.dictionary(pa.int32(), pa.string()), ["a", "b", None]),
    "b": (pa.binary(), [b"\x00\xff", b"", None]), "lb": (pa.large_binary(), [b"\x01" * 5, None]),
    "fb": (pa.binary(3), [b"abc", b"\x00\x00\x01", None]),
    "d32": (pa.date32(), [dt.date(1, 1, 1), dt.date(9999, 12, 31), None]),
    "ts": (pa.timestamp("us"), [dt.datetime(2024, 2, 29, 23, 59, 59, 999999), dt.datetime(1, 1, 1), None]),
    "ts_ms": (pa.timestamp("ms"), [dt.datetime(2024, 1, 1, 0, 0, 0, 123000), None]),
    "ts_ns": (pa.timestamp("ns"), [dt.datetime(2024, 1, 1, 0, 0, 0, 1), None]),
    "tstz": (pa.timestamp("us", tz="Europe/Moscow"), [dt.datetime(2024, 6, 1, 12, 0, 0, 1, tzinfo=UTC), None]),
    "tsutc": (pa.timestamp("s", tz="UTC"), [dt.datetime(1999, 12, 31, 23, 59, 59, tzinfo=UTC), None]),
    "dec": (pa.decimal128(10, 2), [D("1.50"), D("-0.01"), D("99999999.99"), None]),
    "dec38": (pa.decimal128(38, 10), [D("1234567890123456789012345678.0123456789"), D("0E-10")]),
    "dec76": (pa.decimal256(76, 0), [D("9" * 76), D("-1")]),
    "t64": (pa.time64("us"), [dt.time(23, 59, 59, 999999), dt.time(0, 0), None]),
    "dur": (pa.duration("us"), [dt.timedelta(days=3, microseconds=7), dt.timedelta(0), None]),
    "ints": (pa.list_(pa.int64()), [[1, 2 ** 62], [], None]),
    "f64s": (pa.list_(pa.float64()), [[0.1, math.nan, -math.inf, -0.0, None], [], None, [5e-324]]),
    "f32s": (pa.large_list(pa.float32()), [[struct.unpack("f", struct.pack("f", 0.1))[0], math.inf, math.nan], None]),
    "f16s": (pa.list_(pa.float16(), 2), [[0.0999755859375, -math.inf], [None, 0.5]]),
    "words": (pa.list_(pa.string()), [["a", "b"], None]),
    "point": (pa.struct([("x", pa.float64()), ("label", pa.string())]), [{"x": 0.1, "label": "p"}, None]),
}
REFUSED = {
    "dates": (pa.list_(pa.date32()), [[dt.date(2024, 1, 1)], []]),
    "blobs": (pa.struct([("raw", pa.binary())]), [{"raw": b"\x00"}]),
}


def write_kept(path, columns: dict) -> list[str]:
    """A corpus of short documents with COLUMNS beside the text."""
    rows = corpus_rows(n_short=8, n_long=0)[:-1]   # without the empty text: every document in the view
    data = {"id": pa.array([r["id"] for r in rows]), "text": pa.array([r["text"] for r in rows])}
    for name, (type_, values) in columns.items():
        cycled = [values[i % len(values)] for i in range(len(rows))]
        data[name] = pa.array(cycled, type_.value_type if pa.types.is_dictionary(type_) else type_)
        if pa.types.is_dictionary(type_):
            data[name] = data[name].dictionary_encode()
    pq.write_table(pa.table(data), path)
    return list(columns)


def same(want, have, width: str = "d") -> bool:
    """Equal, floats bit for bit (NaN and -0.0 too) at WIDTH (struct's d or f: a real is read
    as the shortest text that is the same float32), decimals digit for digit."""
    if isinstance(want, float):
        return isinstance(have, float) and struct.pack(f">{width}", want) == struct.pack(f">{width}", have)
    if isinstance(want, list) and want and isinstance(want[0], float):   # a float array
        return isinstance(have, list) and len(have) == len(want) and all(
            (w is None and h is None) or same(w, h, width) for w, h in zip(want, have, strict=True))
    if isinstance(want, D):
        return isinstance(have, D) and str(want) == str(have)
    if isinstance(want, int) and not isinstance(want, bool):
        return have == want and not isinstance(have, float)
    return type(want) is type(have) and want == have


def test_kept_columns_of_every_type_publish_exactly(days, pg_url, tmp_path):
    names = write_kept(tmp_path / "kept.parquet", EXACT)
    assert days.run_file(tmp_path / "kept.parquet", "--keep-columns", ",".join(names)) == 0
    view = view_rows(days.out)
    assert publish(days.out, pg_url) == 0
    published = table_rows(pg_url)
    assert view.keys() == published.keys() and len(view) == 9
    for key, row in view.items():
        for name in names:
            want, have = row[name], published[key][name]
            if isinstance(have, D) and not isinstance(want, D):   # uint64 as numeric
                have = int(have)
            if isinstance(want, dt.datetime) and want.tzinfo is not None:   # an instant, whatever zone names it
                want = want.astimezone(UTC)
                have = have.astimezone(UTC)
            assert same(want, have, "f" if name in ("f16", "f32", "f16s", "f32s") else "d"), (key, name, want, have)


@pytest.mark.parametrize("column", sorted(REFUSED))
def test_a_kept_column_that_cannot_publish_exactly_is_refused_before_anything_is_written(days, pg_url, tmp_path,
                                                                                        caplog, column):
    names = write_kept(tmp_path / "kept.parquet", {column: REFUSED[column], "i32": EXACT["i32"]})
    assert days.run_file(tmp_path / "kept.parquet", "--keep-columns", ",".join(names)) == 0
    assert publish(days.out, pg_url) == 2
    refusal = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(refusal) == 1 and column in refusal[0] and "\n" not in refusal[0], refusal
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                            "WHERE nspname = 'public'").fetchone() == (0,)




# name -> (a kept column's type, its values, the words its refusal says)
VALUES_REFUSED = {
    "note": (pa.string(), ["fine", "a NUL \x00 inside"], "a NUL character"),
    "tags": (pa.list_(pa.string()), [["fine"], ["a NUL \x00 inside"]], "a NUL character inside a nested value"),
    "point": (pa.struct([("x", pa.float64())]), [{"x": 1.0}, {"x": math.nan}], "NaN or an infinity inside"),
}


@pytest.mark.parametrize("column", sorted(VALUES_REFUSED))
def test_a_value_postgresql_does_not_hold_is_refused_before_any_row_is_written(days, pg_url, tmp_path, caplog,
                                                                               column):
    """Its column and every document holding it counted, the first named, in one line
    (publishing again would meet them again)."""
    type_, values, words = VALUES_REFUSED[column]
    names = write_kept(tmp_path / "kept.parquet", {column: (type_, values)})
    assert days.run_file(tmp_path / "kept.parquet", "--keep-columns", ",".join(names)) == 0
    assert publish(days.out, pg_url) == 2
    refusal = [r.getMessage() for r in caplog.records if r.levelname == "ERROR" and r.name == "embedpipe"]
    assert len(refusal) == 1 and "\n" not in refusal[0], refusal
    assert f"kept column {column} holds {words}" in refusal[0], refusal
    # all that hold it counted, the first few (in the view's order) named
    assert re.search(r"\(4 documents, the first: 's-[1357]', 's-[1357]', 's-[1357]'\)", refusal[0]), refusal
    assert "publish again" not in refusal[0]
    assert no_rows(pg_url)


def no_rows(url: str) -> bool:
    """NAME and any table of its rows are absent (the shared tables may be there)."""
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT to_regclass('embeddings')").fetchone() == (None,) and not conn.execute(
            "SELECT relname FROM pg_class WHERE relname LIKE 'embedpipe_data_%' OR relname LIKE 'embedpipe_staging_%'"
        ).fetchall()


def test_a_delta_meeting_a_value_postgresql_does_not_hold_writes_nothing(days, pg_url, tmp_path, caplog):
    names = write_kept(tmp_path / "kept.parquet", {"note": (pa.string(), ["fine"])})
    assert days.run_file(tmp_path / "kept.parquet", "--keep-columns", ",".join(names)) == 0
    assert publish(days.out, pg_url) == 0
    before = table_rows(pg_url)
    table = pq.read_table(tmp_path / "kept.parquet")
    notes = table.column("note").to_pylist()
    notes[3] = "now with a NUL \x00"
    pq.write_table(table.set_column(2, "note", pa.array(notes)), tmp_path / "kept.parquet")
    assert days.run_file(tmp_path / "kept.parquet", "--keep-columns", "note", "--sync") == 0
    caplog.clear()
    assert publish(days.out, pg_url) == 2
    assert "kept column note holds a NUL character (document 's-3')" in caplog.text
    assert table_rows(pg_url) == before
