"""The kept columns' types across runs (pipeline/outdir/kept.py): a lossless widening is the
wider type, whichever side it comes from; anything else is no type at all."""
from __future__ import annotations

import pyarrow as pa
import pytest

from pipeline.outdir.kept import Mismatch, decode, encode, join, unify

WIDENS = [
    (pa.int8(), pa.int32(), pa.int32()), (pa.uint8(), pa.int8(), pa.int16()), (pa.uint32(), pa.int64(), pa.int64()),
    (pa.uint16(), pa.uint64(), pa.uint64()), (pa.float16(), pa.float64(), pa.float64()),
    (pa.decimal128(10, 2), pa.decimal128(5, 4), pa.decimal128(12, 4)),
    (pa.decimal128(38, 0), pa.decimal128(38, 10), pa.decimal256(48, 10)),
    (pa.timestamp("s"), pa.timestamp("us"), pa.timestamp("us")),
    (pa.timestamp("ms", tz="Europe/Moscow"), pa.timestamp("ms", tz="UTC"), pa.timestamp("ms", tz="UTC")),
    (pa.time32("s"), pa.time64("ns"), pa.time64("ns")), (pa.date32(), pa.date64(), pa.date64()),
    (pa.duration("ms"), pa.duration("us"), pa.duration("us")),
    (pa.binary(3), pa.binary(), pa.binary()), (pa.binary(), pa.large_binary(), pa.large_binary()),
    (pa.null(), pa.string(), pa.string()),
    (pa.list_(pa.int32()), pa.large_list(pa.int64()), pa.large_list(pa.int64())),
    (pa.struct([("a", pa.int8()), ("b", pa.float32())]), pa.struct([("a", pa.int16()), ("b", pa.float64())]),
     pa.struct([("a", pa.int16()), ("b", pa.float64())])),
    (pa.map_(pa.string(), pa.int32()), pa.map_(pa.string(), pa.int64()), pa.map_(pa.string(), pa.int64())),
]
REFUSED = [
    (pa.int64(), pa.string()), (pa.float64(), pa.int64()), (pa.int64(), pa.float64()), (pa.uint64(), pa.int64()),
    (pa.timestamp("us"), pa.timestamp("us", tz="UTC")), (pa.timestamp("us"), pa.timestamp("ns")),
    (pa.duration("ns"), pa.duration("s")), (pa.date32(), pa.timestamp("s")), (pa.bool_(), pa.int8()),
    (pa.struct([("a", pa.int8())]), pa.struct([("b", pa.int8())])), (pa.decimal256(76, 0), pa.decimal128(10, 5)),
    (pa.list_(pa.int32()), pa.list_(pa.string())), (pa.binary(), pa.string()),
]


@pytest.mark.parametrize("a, b, wider", WIDENS)
def test_a_lossless_widening_is_the_wider_type_either_way(a, b, wider):
    assert join(a, b, "c") == wider and join(b, a, "c") == wider
    assert pa.array([None], a).cast(wider).type == wider   # what the commit casts older files with


@pytest.mark.parametrize("a, b", REFUSED)
def test_any_other_change_is_no_type(a, b):
    for x, y in ((a, b), (b, a)):
        with pytest.raises(Mismatch) as caught:
            join(x, y, "c")
        assert (caught.value.name, caught.value.was, caught.value.now) == ("c", x, y)


def test_fields_join_by_name_nullable_where_either_is_and_the_manifest_keeps_them():
    view = (pa.field("n", pa.int32(), nullable=False), pa.field("x", pa.float32()))
    run = (pa.field("n", pa.int64(), nullable=True), pa.field("x", pa.float32(), nullable=False))
    joined = unify(view, run)
    assert joined == (pa.field("n", pa.int64()), pa.field("x", pa.float32()))
    assert decode(encode(joined)) == joined and decode(encode(())) == ()
