"""KeyIndex: a dict of 16-byte keys in a fraction of a dict's memory."""
from __future__ import annotations

import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from transforms.worker.keyindex import KeyIndex, key16

keys = st.binary(min_size=16, max_size=16)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(keys, st.binary(max_size=40)), unique_by=lambda kv: kv[0], max_size=300),
       st.lists(keys, max_size=50), st.integers(1, 64))
def test_answers_as_a_dict_would(pairs, others, merge_every):
    """Keys that share their first 8 bytes or end in zero bytes included, across merges."""
    rows, expected = KeyIndex(), {}
    rows.MERGE_EVERY = merge_every
    twins = [(k[:8] + bytes(8), b"twin") for k, _ in pairs[:5] if k[8:] != bytes(8)]
    for key, row in pairs + twins:
        if key in expected:
            continue
        rows.put(key, row)
        expected[key] = row
        assert rows.get(key) == row
    assert len(rows) == len(expected)
    for key in [*expected, *others]:
        assert rows.get(key) == expected.get(key)


def test_a_key_with_a_27_byte_row_takes_about_55_bytes():
    import tracemalloc
    n = 40_000
    keys = [hashlib.sha256(str(i).encode()).digest()[:16] for i in range(2 * n)]
    rows = KeyIndex()

    def put(part):
        for i, key in part:
            rows.put(key, bytes(16) + f"doc-{i:07d}".encode())

    tracemalloc.start()
    put(enumerate(keys[:n]))
    first, _ = tracemalloc.get_traced_memory()
    put(enumerate(keys[n:], n))
    second, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert rows.get(keys[123]).endswith(b"doc-0000123") and rows.get(keys[n + 7]).endswith(b"doc-%07d" % (n + 7))
    assert (second - first) / n < 70   # 24 in the arrays, 4 + 27 of row; a dict of bytes took ~160


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.binary(min_size=16, max_size=16), st.binary(max_size=8)), max_size=200),
       st.integers(1, 16))
def test_a_key_put_again_holds_its_last_row(pairs, merge_every):
    index, expected = KeyIndex(), {}
    index.MERGE_EVERY = merge_every
    for key, row in pairs + pairs[::3]:
        index.put(key, row)
        expected[key] = row
    assert len(index) == len(expected)
    assert all(index.get(key) == row and key in index for key, row in expected.items())


def test_rows_of_any_length():
    """A row holds a doc_id, and nothing limits an id's length (a 70 KB one overflowed a 2-byte length)."""
    index = KeyIndex()
    index.MERGE_EVERY = 2
    long_row, key = b"d" * 70_000, bytes(range(16))
    index.put(key, long_row)
    index.put(bytes(16), b"short")
    assert index.get(key) == long_row and index.get(bytes(16)) == b"short"


def test_keys_of_hex_digests_and_of_other_strings():
    sha = hashlib.sha256(b"x").hexdigest()
    assert key16(sha) == bytes.fromhex(sha)[:16]
    assert key16("doc-1\x000") == hashlib.sha256(b"doc-1\x000").digest()[:16]
    assert key16("z" * 64) == hashlib.sha256(b"z" * 64).digest()[:16]   # 64 characters, not hex


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(keys, st.binary(max_size=8)), unique_by=lambda kv: kv[0], max_size=200),
       st.lists(st.booleans(), max_size=200), st.lists(keys, max_size=20), st.integers(1, 16))
def test_discarded_keys_are_gone_and_the_others_kept(pairs, drop, others, merge_every):
    index, expected = KeyIndex(), dict(pairs)
    index.MERGE_EVERY = merge_every
    for key, row in pairs:
        index.put(key, row)
    gone = [key for (key, _), d in zip(pairs, drop, strict=False) if d]  # as many as drop says
    index.discard(gone + others)
    for key in gone + others:
        expected.pop(key, None)
    assert len(index) == len(expected)
    assert all(index.get(key) == row for key, row in expected.items()) and not any(key in index for key in gone)
    index.put(gone[0] if gone else bytes(16), b"again")   # a key discarded may come back
    assert index.get(gone[0] if gone else bytes(16)) == b"again"
