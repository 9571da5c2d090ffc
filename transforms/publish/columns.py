"""The published table's columns, from the view's embeddings schema (no Beam, no database here).

Each column of the view maps to one PostgreSQL type, and its binary COPY type is the same;
`text` is the chunk's text, empty where the view lacks it (transforms/publish/rows.py).
The server computes two columns of NAME from the row (GENERATED):
- `chunk_id`: the key in one text, `doc_id:chunk_index:token_start` (chunk_id_sql): the same
  for the same chunk in every run, and unique, since the two integers hold no colon;
- `text_tsv`: the text's tsvector in a text search configuration (publish.text_search_config).
Two hidden ones make the table the record of what it holds (a hand edit updates them too):
- `_ep_bucket` (0..BUCKETS-1): from the key alone, reproducible here (bucket_of);
- `_ep_hash`: 64 bits of md5 over every column, the vector's bytes included.
Per bucket, the count of rows and the xor of their hashes is a checksum the publish keeps
beside the table: a row edited, deleted or added by hand changes its bucket's.
The expression uses only immutable functions (a generated column needs them): md5 of text,
and md5 of each other type's binary send function (never a text form, whose output depends
on settings such as TimeZone).
"""
from __future__ import annotations

import dataclasses
import hashlib

import pyarrow as pa

KEY = ("doc_id", "chunk_index", "token_start")
BUCKET, HASH = "_ep_bucket", "_ep_hash"
TEXT, CHUNK_ID, TSV = "text", "chunk_id", "text_tsv"
# The key's unique index is a btree on (doc_id, chunk_index, token_start), which a user's foreign
# key may refer to; a btree entry holds at most ~2.7 kB, so a table with a longer id keys on the
# id's md5 instead (two ids with one md5 would have to be made for it), with a hash index on the
# id for lookups by it.
KEY_BYTES = 2000      # the longest id, in bytes, of a table keyed on the id itself
NAME_BYTES = 63       # PostgreSQL's names (NAMEDATALEN - 1): it cuts a longer one, silently
MAX_COLUMNS = 1600    # PostgreSQL's columns per table
BUCKET_BITS = 12
BUCKETS = 1 << BUCKET_BITS

# The contract's columns, in the order NAME shows them, and their types: the chunk's text, then
# the generated columns, after the others (NAME keeps the columns it had before them: a view is
# only replaced by one with more columns after its own).
CONTRACT = (("doc_id", "text"), ("chunk_index", "integer"), ("chunk_count", "integer"),
            ("token_start", "integer"), ("token_end", "integer"), ("n_tokens", "integer"),
            ("text_sha256", "text"), ("model", "text"), ("embedding", None), ("request_id", "text"),
            ("cost_rub", "numeric"), ("run_id", "text"), ("embedded_at", "timestamptz"), (TEXT, "text"))
# NAME's columns the server computes, after the contract's and before the kept ones
GENERATED = ((CHUNK_ID, "text"), (TSV, "tsvector"))

# An array's send function is only stable (a generated column needs immutable ones): arrays are
# hashed by the hash of their elements' (64 bits; it takes -0.0 for 0.0, which no edit by hand
# that matters tells apart).
ARRAY_HASH = "hash_array_extended"
# PostgreSQL type -> (its binary COPY name for psycopg, its send function for the row hash)
_TYPES = {"text": ("text", None), "integer": ("int4", "int4send"), "bigint": ("int8", "int8send"),
          "smallint": ("int2", "int2send"), "real": ("float4", "float4send"),
          "double precision": ("float8", "float8send"), "boolean": ("bool", "boolsend"),
          "date": ("date", "date_send"), "timestamptz": ("timestamptz", "timestamptz_send"),
          "timestamp": ("timestamp", "timestamp_send"), "bytea": ("bytea", "byteasend"),
          "numeric": ("numeric", "numeric_send"), "jsonb": ("jsonb", "jsonb_send"), "time": ("time", "time_send"),
          "interval": ("interval", "interval_send"), "real[]": ("float4[]", ARRAY_HASH),
          "double precision[]": ("float8[]", ARRAY_HASH)}

# Arrow type -> the PostgreSQL type that holds each of its values exactly (real holds every
# half float; numeric every uint64; timestamps and times hold microseconds, as a view's values
# are: pyarrow gives no finer ones to the job that wrote them)
_SCALARS = ((pa.types.is_null, "text"), (pa.types.is_boolean, "boolean"), (pa.types.is_int8, "smallint"),
            (pa.types.is_int16, "smallint"), (pa.types.is_uint8, "smallint"), (pa.types.is_int32, "integer"),
            (pa.types.is_uint16, "integer"), (pa.types.is_int64, "bigint"), (pa.types.is_uint32, "bigint"),
            (pa.types.is_uint64, "numeric"), (pa.types.is_float16, "real"), (pa.types.is_float32, "real"),
            (pa.types.is_float64, "double precision"), (pa.types.is_string, "text"),
            (pa.types.is_large_string, "text"), (pa.types.is_string_view, "text"), (pa.types.is_binary, "bytea"),
            (pa.types.is_large_binary, "bytea"), (pa.types.is_fixed_size_binary, "bytea"),
            (pa.types.is_binary_view, "bytea"), (pa.types.is_date, "date"), (pa.types.is_time, "time"),
            (pa.types.is_duration, "interval"), (pa.types.is_decimal, "numeric"))
# leaves of a nested value that JSON (jsonb) holds as they are: numbers, text, true/false, null
_JSON_LEAVES = (pa.types.is_null, pa.types.is_boolean, pa.types.is_integer, pa.types.is_floating,
                pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view)


class Unpublishable(ValueError):
    """A kept column whose values no PostgreSQL type holds exactly, or whose name no column of
    the table can have; the message names it."""


def name_refusal(name: str) -> str | None:
    """Why the table could not have a column for the kept column NAME, or None: a name of one of
    the table's own columns, one PostgreSQL would cut or cannot hold."""
    if name in (BUCKET, HASH):
        return (f"kept column {name} has the name of a column the published table computes itself (its row's "
                "bucket and hash)")
    if name.casefold() in (CHUNK_ID, TSV):
        return (f"kept column {name} has the name of a column the published table computes itself (the chunk's id "
                "and its text's search vector)")
    if name.casefold() == TEXT:
        return f"kept column {name} has the name of the published table's column of the chunk's text"
    if len(name.encode()) > NAME_BYTES:
        return f"kept column {name} has a name of {len(name.encode())} bytes, which PostgreSQL would cut to {NAME_BYTES}"
    if "\x00" in name:
        return f"kept column {name!r} has a NUL character in its name, which PostgreSQL's names do not hold"
    return None


def count_refusal(kept: int) -> str | None:
    if kept > (room := MAX_COLUMNS - len(CONTRACT) - len(GENERATED) - 2):
        return f"{kept} kept columns are more than the {room} a PostgreSQL table has room for beside its own"
    return None


@dataclasses.dataclass(frozen=True)
class Column:
    name: str
    type: str          # as in CREATE TABLE
    copy_type: str     # psycopg's name of it in a binary COPY
    send: str | None   # its binary send function (None: text, hashed as itself)


def pg_type(field: pa.Field) -> str:
    """A kept column's type in PostgreSQL; nested values go as JSON. Unpublishable when none
    holds its values exactly."""
    t = field.type.value_type if pa.types.is_dictionary(field.type) else field.type
    if pa.types.is_timestamp(t):
        return "timestamptz" if t.tz else "timestamp"
    for check, name in _SCALARS:
        if check(t):
            return name
    if _list(t) and pa.types.is_floating(t.value_type):   # NaN and infinities: JSON holds none
        return "double precision[]" if pa.types.is_float64(t.value_type) else "real[]"
    if _nested(t):
        if (leaf := _not_json(t)) is None:
            return "jsonb"
        raise Unpublishable(f"kept column {field.name} ({t}) holds {leaf} values in a nested value, which JSON "
                            "(jsonb, the table's type for nested values) does not hold exactly")
    raise Unpublishable(f"kept column {field.name} ({t}) has no PostgreSQL type that holds its values exactly")


def _list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _nested(t: pa.DataType) -> bool:
    return _list(t) or pa.types.is_struct(t) or pa.types.is_map(t)


def _not_json(t: pa.DataType) -> pa.DataType | None:
    """A leaf type of nested T that JSON does not hold as it is, if any."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    if _nested(t):
        for i in range(t.num_fields):
            if (leaf := _not_json(t.field(i).type)) is not None:
                return leaf
        return None
    return None if any(check(t) for check in _JSON_LEAVES) else t


def vector_type(dimensions: int) -> str:
    return f"vector({dimensions})"


def columns(kept: list[pa.Field], dimensions: int) -> list[Column]:
    """The table's columns: the contract's, then the kept ones (types from the view's schema)."""
    for refusal in (count_refusal(len(kept)), *(name_refusal(f.name) for f in kept)):
        if refusal is not None:
            raise Unpublishable(refusal)
    found = []
    for name, type_ in CONTRACT:
        if type_ is None:
            found.append(Column(name, vector_type(dimensions), "vector", "vector_send"))
        else:
            found.append(Column(name, type_, *_TYPES[type_]))
    for field in kept:
        type_ = pg_type(field)
        found.append(Column(field.name, type_, *_TYPES[type_]))
    return found


def key_index(longest_id: int) -> str:
    """The columns of the key's unique index of a table whose longest id is LONGEST_ID bytes."""
    return "(md5(doc_id)::uuid), chunk_index, token_start" if longest_id > KEY_BYTES else ", ".join(KEY)


def chunk_id_sql() -> str:
    """chunk_id's expression (immutable, as a generated column's must be: text casts of integers)."""
    return "(doc_id || ':' || chunk_index::text || ':' || token_start::text)"


def chunk_id(doc_id: str, chunk_index: int, token_start: int) -> str:
    """The chunk_id of a key, as the server computes it (chunk_id_sql)."""
    return f"{doc_id}:{chunk_index}:{token_start}"


def tsv_sql(config: str) -> str:
    """text_tsv's expression in the text search configuration CONFIG, an SQL literal (to_tsvector
    of a regconfig is immutable, as a generated column's expression must be; the one-argument
    form reads a setting)."""
    return f"to_tsvector({config}::regconfig, {TEXT})"


def bucket_of(doc_id: str, chunk_index: int, token_start: int) -> int:
    """The bucket of a key, as the server computes it (bucket_sql)."""
    digest = hashlib.md5(f"{doc_id}/{chunk_index}/{token_start}".encode()).hexdigest()
    return int(digest[:BUCKET_BITS // 4], 16)


def bucket_sql() -> str:
    return (f"(('x' || left(md5(doc_id || '/' || chunk_index::text || '/' || token_start::text), "
            f"{BUCKET_BITS // 4}))::bit({BUCKET_BITS})::integer)")


def hash_sql(cols: list[Column], quote) -> str:
    """The row hash over COLS; QUOTE makes a column name an SQL identifier."""
    parts = []
    for c in cols:
        name = quote(c.name)
        if c.send is None:
            value = f"md5({name})"
        elif c.send == ARRAY_HASH:
            value = f"md5({ARRAY_HASH}({name}, 0)::text)"
        else:
            value = f"md5({c.send}({name}))"
        parts.append(f"coalesce({value}, '-')")
    return f"(('x' || left(md5({' || '.join(parts)}), 16))::bit(64)::bigint)"
