"""How NAME's vectors are indexed and searched, decided by their length before anything is
loaded (pgvector's HNSW takes at most 2,000 dimensions of `vector`, 4,000 of `halfvec`).

NAME shows `embedding` as an unconstrained `vector` (VIEW_EMBEDDING: one type whatever the
length, so a statement prepared on NAME keeps its result type across a switch), while the data
table holds `vector(d)`. The HNSW index is on an expression of the data table's column that
is exactly what a query on NAME computes from the view's column (the planner matches an index
expression node for node): `embedding` itself up to 2,000 dimensions (the planner looks through
the view's relabelling to a plain column), `(embedding::vector)::halfvec(d)` up to 4,000, and
above that the first 4,000 dimensions as halfvec, whose nearest candidates a search re-ranks
by the whole vector (exact cosine), `publish.rerank_factor` candidates per result.
"""
from __future__ import annotations

import dataclasses
import re
from typing import ClassVar

import psycopg
from psycopg import sql

from pipeline.publish.names import Names
from pipeline.settings.config import PublishSettings
from transforms.publish.columns import CHUNK_ID, KEY_BYTES, TSV, key_index

VECTOR_MAX, HALFVEC_MAX = 2000, 4000   # pgvector's HNSW limits
VIEW_EMBEDDING = "embedding::vector"   # NAME's embedding column, over the data table's


@dataclasses.dataclass(frozen=True)
class Index:
    dimensions: int

    UNNAMED: ClassVar[str] = "embedding vector_cosine_ops"   # a record that names no index: one of the column

    @property
    def kind(self) -> str:
        if self.dimensions <= VECTOR_MAX:
            return "vector"
        return "halfvec" if self.dimensions <= HALFVEC_MAX else "prefix"

    @property
    def width(self) -> int:
        """The dimensions the index holds."""
        return min(self.dimensions, HALFVEC_MAX)

    @property
    def reranks(self) -> bool:
        return self.kind == "prefix"

    def key(self, vector: str) -> str:
        """What the index orders by, of VECTOR (SQL of a `vector` value: NAME's column, or a
        query's vector)."""
        if self.kind == "vector":
            return vector
        part = vector if self.kind == "halfvec" else f"subvector({vector}, 1, {self.width})"
        return f"({part})::halfvec({self.width})"

    @property
    def opclass(self) -> str:
        return "vector_cosine_ops" if self.kind == "vector" else "halfvec_cosine_ops"

    @property
    def signature(self) -> str:
        """The index as the record names it: a table indexed otherwise is built again."""
        return f"{self.indexed} {self.opclass}"

    @property
    def indexed(self) -> str:
        """The data table's indexed expression: the key of NAME's column."""
        return "embedding" if self.kind == "vector" else f"({self.key(f'({VIEW_EMBEDDING})')})"

    def lacking_in(self, version: str) -> str | None:
        """What pgvector of VERSION lacks that this index needs, if anything."""
        have = tuple(int(part) for part in re.findall(r"\d+", version)[:3])
        if have < (0, 5, 0):
            return "HNSW index (0.5.0)"
        if self.kind != "vector" and have < (0, 7, 0):
            return "halfvec type (0.7.0)"
        return None

    def describe(self, model: str) -> str:
        """One line: how MODEL's vectors are indexed."""
        if self.kind == "vector":
            return f"{model}'s {self.dimensions:,} dimensions: an HNSW index of the vectors (cosine)"
        if self.kind == "halfvec":
            return (f"{model}'s {self.dimensions:,} dimensions, more than HNSW takes of vector ({VECTOR_MAX:,}): "
                    f"an HNSW index of them as halfvec (cosine)")
        return (f"{model}'s {self.dimensions:,} dimensions, more than HNSW takes even as halfvec ({HALFVEC_MAX:,}): "
                f"an HNSW index of the first {self.width:,} as halfvec (cosine), whose candidates each search "
                "re-ranks by the whole vector")


def work_mem_mb(rows: int, index: Index, settings: PublishSettings) -> int:
    """What the HNSW graph of ROWS needs in memory (pgvector keeps each element's vector and
    its neighbour lists: 2m on layer 0, m above), with room, up to the setting."""
    width = 4 * index.width if index.kind == "vector" else 2 * index.width
    need = rows * (width + 3 * settings.hnsw_m * 8 + 100) * 1.3 / 2 ** 20
    return int(max(64, min(settings.maintenance_work_mem_mb, need)))


def build_indexes(conn: psycopg.Connection, names: Names, table: str, index: Index, rows: int,
                  settings: PublishSettings, longest_id: int = 0) -> None:
    """The key's unique index (on the id's md5 above KEY_BYTES, with a hash index on the id:
    transforms/publish/columns.py), chunk_id's (unique; a hash index above KEY_BYTES, chunk_id
    being unique as the key is), the GIN index of text_tsv, the HNSW index, the planner's
    statistics."""
    conn.execute(sql.SQL("SET maintenance_work_mem = {}").format(
        sql.Literal(f"{work_mem_mb(rows, index, settings)}MB")))
    conn.execute(sql.SQL("SET max_parallel_maintenance_workers = {}").format(
        sql.Literal(settings.parallel_index_workers)))
    conn.execute(sql.SQL("CREATE UNIQUE INDEX {} ON {} ({})").format(
        sql.Identifier(f"{table}_key"), names(table), sql.SQL(key_index(longest_id))))
    if longest_id > KEY_BYTES:
        conn.execute(sql.SQL("CREATE INDEX {} ON {} USING hash (doc_id)").format(
            sql.Identifier(f"{table}_doc"), names(table)))
    conn.execute(sql.SQL("CREATE {}INDEX {} ON {} {}").format(
        sql.SQL("" if longest_id > KEY_BYTES else "UNIQUE "), sql.Identifier(f"{table}_chunk"), names(table),
        sql.SQL("USING hash ({})" if longest_id > KEY_BYTES else "({})").format(sql.Identifier(CHUNK_ID))))
    conn.execute(sql.SQL("CREATE INDEX {} ON {} USING gin ({})").format(
        sql.Identifier(f"{table}_tsv"), names(table), sql.Identifier(TSV)))
    conn.execute(sql.SQL("CREATE INDEX {} ON {} USING hnsw ({} {}) WITH (m = {}, ef_construction = {})").format(
        sql.Identifier(f"{table}_hnsw"), names(table), sql.SQL(index.indexed), sql.SQL(index.opclass),
        sql.Literal(settings.hnsw_m), sql.Literal(settings.hnsw_ef_construction)))
    conn.execute(sql.SQL("ANALYZE {}").format(names(table)))
    conn.execute("RESET maintenance_work_mem")
    conn.execute("RESET max_parallel_maintenance_workers")


def candidates(index: Index, k: int, settings: PublishSettings) -> int:
    """How many rows a search takes from the index for K results (pipeline/publish/search.py)."""
    return k * settings.rerank_factor if index.reranks else k
