"""Values their column's PostgreSQL type does not hold, found before anything is written (no Beam,
no database here).

A column's type holds every value of its Arrow type (transforms/publish/columns.py), but for:
- a NUL character in a text (PostgreSQL's `text` holds none, nor a JSON string in `jsonb`): a
  document id, the chunk's text (refused, not mapped: NAME's text is the view's, and its
  sha256 is `text_sha256`), a kept column of strings, or a string inside a nested value;
- NaN or an infinity inside a nested value (`jsonb` numbers are decimals; a list of floats is a
  float array, which holds them).
The publish reads the columns that may hold one (never the vectors) of the rows it is about to
write, all of them, and refuses in one line naming each column, how many documents have one
and the first few: one fix of the input, not one a document. A text
is searched for a NUL in its bytes as they are in memory (a few ms for 100 MB): the texts of
a whole view are read at a build.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from transforms.publish.columns import TEXT, Column

OURS = frozenset(("text_sha256", "model", "request_id", "run_id"))   # written by the run: hex, ids, a model's name
_SHOWN = 60   # characters of a document id a message shows


def scanned(cols: Sequence[Column]) -> list[str]:
    """The columns of COLS whose values may not fit their type."""
    return [c.name for c in cols if c.type in ("text", "jsonb") and c.name not in OURS]


def _leaves(values: pa.Array) -> Iterator[pa.Array]:
    """The scalar arrays under VALUES, nested values unnested (the values under a null left out)."""
    t = values.type
    if pa.types.is_dictionary(t):
        values = values.dictionary_decode()
        t = values.type
    if pa.types.is_map(t):
        yield from _leaves(values.keys)
        yield from _leaves(values.items)
    elif pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        yield from _leaves(values.flatten())
    elif pa.types.is_struct(t):
        for child in values.flatten():
            yield from _leaves(child)
    else:
        yield values


def _nul_byte(leaf: pa.Array) -> bool:
    """Whether LEAF (a string array) holds a NUL: one pass over its data buffer, copying
    nothing (argmin); a zero byte found is checked value by value (the bytes under a null are
    not a value)."""
    offsets, data = leaf.buffers()[1:3]
    if data is None or not len(leaf):
        return False
    ends = np.frombuffer(offsets, dtype=np.int64 if pa.types.is_large_string(leaf.type) else np.int32)
    ends = ends[leaf.offset:leaf.offset + len(leaf) + 1]
    values = np.frombuffer(data, dtype=np.uint8)[ends[0]:ends[-1]]
    return bool(values.size) and values[values.argmin()] == 0 and pc.any(pc.match_substring(leaf, "\x00")).as_py()


def _fault(leaf: pa.Array) -> str | None:
    t = leaf.type
    if (pa.types.is_string(t) or pa.types.is_large_string(t)) and _nul_byte(leaf):
        return NUL
    if pa.types.is_floating(t) and pc.any(pc.invert(pc.is_finite(leaf))).as_py():
        return "NaN or an infinity"
    return None


NUL = "a NUL character"
SHOWN_DOCS = 3   # documents a refusal names; it counts them all


def holds_nul(column: pa.Array) -> bool:
    """Whether a value of COLUMN (nested values too) holds a NUL character."""
    return any((pa.types.is_string(leaf.type) or pa.types.is_large_string(leaf.type)) and _nul_byte(leaf)
               for leaf in _leaves(column))


def rows_with(column: pa.Array, fault: str) -> list[int]:
    """The rows of COLUMN whose value holds FAULT: a column of strings at once, a nested one
    row by row (a refusal's path only)."""
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if fault == NUL and (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        found = pc.fill_null(pc.match_substring(column, "\x00"), False)
        return [int(i) for i in np.flatnonzero(found.to_numpy(zero_copy_only=False))]
    return [i for i in range(len(column)) if any(_fault(leaf) == fault for leaf in _leaves(column.slice(i, 1)))]


# (column, fault) -> the documents whose values hold it, each once
Faults = dict[tuple[str, str], dict[str, None]]


def faults(table: pa.Table, cols: Sequence[Column], found: Faults | None = None) -> Faults:
    """Every value of TABLE (the rows about to be written, with `doc_id` and the scanned columns
    of COLS) that does not fit its column, added to FOUND: a refusal names them all at once."""
    found = {} if found is None else found
    for name in scanned(cols):
        if name not in table.column_names:   # the text, in a file written without it
            continue
        column = table.column(name).combine_chunks()
        for fault in dict.fromkeys(filter(None, map(_fault, _leaves(column)))):
            docs = found.setdefault((name, fault), {})
            ids = table.column("doc_id").combine_chunks()
            docs.update(dict.fromkeys(ids.take(pa.array(rows_with(column, fault), pa.int64())).to_pylist()))
    return found


def shown(docs: Sequence[str]) -> str:
    """`document 'a'`, or `3 documents: 'a', 'b', 'c'`, or `9 documents, the first: 'a', 'b', 'c'`."""
    names = ", ".join(repr(d if len(d) <= _SHOWN else f"{d[:_SHOWN]}...") for d in docs[:SHOWN_DOCS])
    if len(docs) == 1:
        return f"document {names}"
    return f"{len(docs)} documents{', the first' if len(docs) > SHOWN_DOCS else ''}: {names}"


def refusal(found: Faults, cols: Sequence[Column]) -> str | None:
    """Why the values in FOUND do not fit their columns (one clause a column and fault), or None."""
    types = {c.name: c.type for c in cols}
    clauses = []
    for (name, fault), docs in found.items():
        what = {"doc_id": "the document id", TEXT: "the chunk's text"}.get(name, f"kept column {name}")
        holder = ("PostgreSQL's text" if types[name] == "text" else
                  "JSON (jsonb, the table's type for nested values)")
        inside = " inside a nested value" if types[name] == "jsonb" else ""
        # sorted: the same documents named whatever order the view's files hold them in
        clauses.append(f"{what} holds {fault}{inside} ({shown(sorted(docs))}), which {holder} does not hold")
    return "; ".join(clauses) or None


def longest_id(table: pa.Table) -> int:
    """The bytes of TABLE's longest `doc_id` (the key's index depends on it: columns.key_index)."""
    return pc.max(pc.binary_length(table.column("doc_id"))).as_py() or 0
