"""The published table's columns, from the view's embeddings schema (no Beam, no database here).

Each column of the view maps to one PostgreSQL type, and its binary COPY type is the same.
Two hidden columns, computed by the server from the row (generated, so a hand edit updates
them too), make the table the record of what it holds:
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
BUCKET_BITS = 12
BUCKETS = 1 << BUCKET_BITS
HALFVEC_ABOVE = 2000   # pgvector indexes vectors up to 2,000 dimensions, halfvec up to 4,000

# The contract's columns, in the order the view reads them, and their types.
CONTRACT = (("doc_id", "text"), ("chunk_index", "integer"), ("chunk_count", "integer"),
            ("token_start", "integer"), ("token_end", "integer"), ("n_tokens", "integer"),
            ("text_sha256", "text"), ("model", "text"), ("embedding", None), ("request_id", "text"),
            ("cost_rub", "numeric"), ("run_id", "text"), ("embedded_at", "timestamptz"))

# PostgreSQL type -> (its binary COPY name for psycopg, its send function for the row hash)
_TYPES = {"text": ("text", None), "integer": ("int4", "int4send"), "bigint": ("int8", "int8send"),
          "smallint": ("int2", "int2send"), "real": ("float4", "float4send"),
          "double precision": ("float8", "float8send"), "boolean": ("bool", "boolsend"),
          "date": ("date", "date_send"), "timestamptz": ("timestamptz", "timestamptz_send"),
          "timestamp": ("timestamp", "timestamp_send"), "bytea": ("bytea", "byteasend"),
          "numeric": ("numeric", "numeric_send"), "jsonb": ("jsonb", "jsonb_send")}


@dataclasses.dataclass(frozen=True)
class Column:
    name: str
    type: str          # as in CREATE TABLE
    copy_type: str     # psycopg's name of it in a binary COPY
    send: str | None   # its binary send function (None: text, hashed as itself)


def pg_type(t: pa.DataType) -> str:
    """A kept column's type in PostgreSQL; values of nested types go as JSON."""
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_dictionary(t):
        return "text"
    for check, name in ((pa.types.is_boolean, "boolean"), (pa.types.is_int8, "smallint"),
                        (pa.types.is_int16, "smallint"), (pa.types.is_int32, "integer"),
                        (pa.types.is_uint8, "smallint"), (pa.types.is_uint16, "integer"),
                        (pa.types.is_uint32, "bigint"), (pa.types.is_int64, "bigint"),
                        (pa.types.is_float32, "real"), (pa.types.is_float64, "double precision"),
                        (pa.types.is_date, "date"), (pa.types.is_binary, "bytea"),
                        (pa.types.is_large_binary, "bytea"), (pa.types.is_decimal, "numeric")):
        if check(t):
            return name
    if pa.types.is_timestamp(t):
        return "timestamptz" if t.tz else "timestamp"
    return "jsonb"


def vector_type(dimensions: int) -> str:
    return f"vector({dimensions})"


def columns(kept: list[pa.Field], dimensions: int) -> list[Column]:
    """The table's columns: the contract's, then the kept ones (types from the view's schema)."""
    found = []
    for name, type_ in CONTRACT:
        if type_ is None:
            found.append(Column(name, vector_type(dimensions), "vector", "vector_send"))
        else:
            found.append(Column(name, type_, *_TYPES[type_]))
    for field in kept:
        type_ = pg_type(field.type)
        found.append(Column(field.name, type_, *_TYPES[type_]))
    return found


def index_expression(dimensions: int) -> tuple[str, str]:
    """(the indexed expression, its operator class): halfvec above what a vector index takes.
    A query must order by the same expression to use the index (pipeline/publish/database.py:
    nearest)."""
    if dimensions > HALFVEC_ABOVE:
        return f"(embedding::halfvec({dimensions}))", "halfvec_cosine_ops"
    return "embedding", "vector_cosine_ops"


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
        value = f"md5({name})" if c.send is None else f"md5({c.send}({name}))"
        parts.append(f"coalesce({value}, '-')")
    return f"(('x' || left(md5({' || '.join(parts)}), 16))::bit(64)::bigint)"
