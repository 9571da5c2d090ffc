"""The statement `search` runs on NAME: a vector leg, a full-text leg, or both fused by
reciprocal rank, each leg over its own index, filtered by `--where`.

- The vector leg orders by the key the HNSW index holds (pipeline/publish/index.py) and takes
  its candidates, then orders them by the exact cosine distance of the whole vectors. With a
  filter, pgvector's iterative scan goes on through the graph until enough rows pass it
  (`relaxed_order`: the leg orders its candidates itself).
- The text leg matches `text_tsv @@ websearch_to_tsquery(config, words)` through the GIN index
  and scores with `ts_rank_cd`. PostgreSQL scores every row a query matches (no index orders by
  rank), so the leg scores at most `search.text_rank_rows` of them: the first the index yields.
- Hybrid: each leg ranks its best `search.leg_rows` (at least k); a chunk scores
  1 / (rrf_k + rank) in each leg that found it, summed; a chunk one leg found is ranked too.
  Ties go to the chunk the vector leg ranks higher, then to the text leg's order (the order
  LangChain's fusion gives them).

Every value (the words, the vector, a filter's) is a parameter; a filter's value is cast to
its column's type as the catalogue names it. The search's own fields come first in each row,
NAME's columns after them, read by position: a kept column may have any name.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import psycopg
from psycopg import sql

from pipeline.publish.index import Index, candidates
from pipeline.publish.names import Names
from pipeline.settings.config import PublishSettings, SearchSettings

MODES = ("hybrid", "vector", "text")
SHOWN = ("chunk_id", "doc_id", "chunk_index", "token_start", "token_end", "text")   # each hit's, in order
OWN = ("score", "vector_rank", "vector_score", "text_rank", "text_score")          # the search's fields
UNFILTERED = ("embedding", "text_tsv")   # columns --where does not take: no value of theirs is typed
EF_SEARCH_MAX = 1000   # pgvector's bound of hnsw.ef_search: more candidates come by the iterative scan


@dataclasses.dataclass(frozen=True)
class Filter:
    """COLUMN equal to one of VALUES (text, cast by the server to TYPE, the column's)."""
    column: str
    type: str
    values: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Query:
    """What to search for: VECTOR an SQL expression of the query's vector (its values in the
    parameters), or None for the text leg alone; WORDS the text leg's query, or None for the
    vector leg alone."""
    k: int
    vector: sql.Composable | None
    words: str | None
    config: str = "simple"
    filters: tuple[Filter, ...] = ()
    exclude_doc: str | None = None

    @property
    def hybrid(self) -> bool:
        return self.vector is not None and self.words is not None


def depth(query: Query, settings: SearchSettings) -> int:
    """The rows each leg ranks: k alone, at least leg_rows when fused."""
    return max(query.k, settings.leg_rows) if query.hybrid else query.k


def _where(query: Query, *more: sql.Composable) -> tuple[sql.Composable, dict[str, Any]]:
    """The filters (and MORE conditions) as SQL, and their parameters."""
    parts, params = list(more), {}
    for i, f in enumerate(query.filters):
        names = []
        for j, value in enumerate(f.values):
            params[f"w{i}_{j}"] = value
            names.append(sql.SQL("{}::{}").format(sql.Placeholder(f"w{i}_{j}"), sql.SQL(f.type)))
        parts.append(sql.SQL("{} IN ({})").format(sql.Identifier(f.column), sql.SQL(", ").join(names)))
    if query.exclude_doc is not None:
        parts.append(sql.SQL("doc_id <> %(exclude)s"))
        params["exclude"] = query.exclude_doc
    if not parts:
        return sql.SQL(""), params
    return sql.SQL("WHERE ") + sql.SQL(" AND ").join(parts), params


def _vector_leg(names: Names, index: Index, query: Query, settings: PublishSettings, rows: int) -> sql.Composed:
    where, _ = _where(query)
    v = "(SELECT v FROM q)"   # a scalar subquery: the index takes it as a constant
    return sql.SQL(
        "vector_leg AS (SELECT chunk_id, row_number() OVER (ORDER BY distance, chunk_id) AS rank, "
        "1 - distance AS score FROM (SELECT chunk_id, embedding <=> {v} AS distance FROM {name} {where} "
        "ORDER BY {key} <=> {qkey} LIMIT {candidates}) c ORDER BY rank LIMIT {rows})").format(
        v=sql.SQL(v), name=names(), where=where, key=sql.SQL(index.key("embedding")), qkey=sql.SQL(index.key(v)),
        candidates=sql.Literal(candidates(index, rows, settings)), rows=sql.Literal(rows))


def _text_leg(names: Names, query: Query, settings: SearchSettings, rows: int) -> sql.Composed:
    where, _ = _where(query, sql.SQL("text_tsv @@ (SELECT t FROM q)"))
    return sql.SQL(
        "text_leg AS (SELECT chunk_id, row_number() OVER (ORDER BY score DESC, chunk_id) AS rank, score FROM "
        "(SELECT chunk_id, ts_rank_cd(text_tsv, (SELECT t FROM q)) AS score FROM (SELECT chunk_id, text_tsv "
        "FROM {name} {where} LIMIT {cap}) m) s ORDER BY rank LIMIT {rows})").format(
        name=names(), where=where, cap=sql.Literal(settings.text_rank_rows), rows=sql.Literal(rows))


def statement(names: Names, index: Index, kept: list[str], query: Query, publish: PublishSettings,
              search: SearchSettings) -> tuple[sql.Composed, dict[str, Any]]:
    """The search's statement and its parameters: per hit, OWN, then SHOWN and KEPT (NAME's)."""
    rows = depth(query, search)
    legs: list[sql.Composable] = []
    q: list[sql.Composable] = []
    fused: sql.Composable
    order: sql.Composable
    if query.vector is not None:
        q.append(sql.SQL("({})::vector AS v").format(query.vector))
        legs.append(_vector_leg(names, index, query, publish, rows))
    if query.words is not None:
        q.append(sql.SQL("websearch_to_tsquery(%(config)s::regconfig, %(words)s) AS t"))
        legs.append(_text_leg(names, query, search, rows))
    if query.hybrid:
        rrf = sql.Literal(search.rrf_k)
        fused = sql.SQL(
            "SELECT chunk_id, coalesce(1.0::float8 / ({rrf} + v.rank), 0) + coalesce(1.0::float8 / ({rrf} + t.rank), 0) "
            "AS score, "
            "v.rank AS vector_rank, v.score AS vector_score, t.rank AS text_rank, t.score AS text_score "
            "FROM vector_leg v FULL JOIN text_leg t USING (chunk_id)").format(rrf=rrf)
        order = sql.SQL("f.score DESC, f.vector_rank NULLS LAST, f.text_rank")
    elif query.vector is not None:
        fused = sql.SQL("SELECT chunk_id, score, rank AS vector_rank, score AS vector_score, NULL::bigint AS text_rank, "
                        "NULL::real AS text_score FROM vector_leg")
        order = sql.SQL("f.vector_rank")
    else:
        fused = sql.SQL("SELECT chunk_id, score, NULL::bigint AS vector_rank, NULL::float8 AS vector_score, "
                        "rank AS text_rank, score AS text_score FROM text_leg")
        order = sql.SQL("f.text_rank")
    fields = [sql.SQL("f.{}").format(sql.Identifier(c)) for c in OWN]
    fields += [sql.SQL("n.{}").format(sql.Identifier(c)) for c in (*SHOWN, *kept)]
    text = sql.SQL(
        "WITH q AS MATERIALIZED (SELECT {q}), {legs}, fused AS ({fused}) SELECT {fields} FROM fused f "
        "JOIN {name} n USING (chunk_id) ORDER BY {order} LIMIT {k}").format(
        q=sql.SQL(", ").join(q), legs=sql.SQL(", ").join(legs), fused=fused, fields=sql.SQL(", ").join(fields),
        name=names(), order=order, k=sql.Literal(query.k))
    _, params = _where(query)
    if query.words is not None:
        params.update(config=query.config, words=query.words)
    return text, params


def run(conn: psycopg.Connection, names: Names, index: Index, kept: list[str], query: Query, params: dict[str, Any],
        publish: PublishSettings, search: SearchSettings) -> list[tuple[Any, ...]]:
    """QUERY's hits on NAME (rows as statement() orders their fields), in one transaction whose
    settings are the search's: hnsw.ef_search at least the vector leg's candidates (within
    pgvector's bound), the iterative scan where a filter may drop the graph's nearest or more
    candidates are needed than that bound."""
    text, own = statement(names, index, kept, query, publish, search)
    with conn.transaction():
        if query.vector is not None:
            need = candidates(index, depth(query, search), publish)
            ef = min(EF_SEARCH_MAX, max(publish.ef_search, need))
            conn.execute(sql.SQL("SET LOCAL hnsw.ef_search = {}").format(sql.Literal(ef)))
            if query.filters or query.exclude_doc is not None or need > ef:
                conn.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
        return conn.execute(text, {**params, **own}).fetchall()


def words_searchable(conn: psycopg.Connection, config: str, words: str) -> bool:
    """Whether WORDS leave any lexeme to search for under CONFIG (not only stop words or
    punctuation): an empty query matches nothing, and PostgreSQL says so in a notice."""
    row = conn.execute("SELECT numnode(websearch_to_tsquery(%s::regconfig, %s))", (config, words)).fetchone()
    return bool(row and row[0])
