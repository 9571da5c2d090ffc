"""Shared by the search tests: a published corpus of passages with kept columns whose names the
search's own output uses, `search --json`, and the fused ranking computed by hand from the two
legs, each read from the table by a statement of its own (an exact scan of the vectors, every
matching row's ts_rank_cd), not by the search's."""
from __future__ import annotations

import datetime as dt
import json
import random
from pathlib import Path

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
from psycopg import sql

from pipeline.cli import main
from service.sandbox.embedder import embed_batch
from tests.e2e.helpers import WORDS_EN, WORDS_RU, paragraph
from tests.e2e.money_helpers import MODEL
from tests.publish.helpers import publish

KEPT = ("lang", "similarity", "score", "day")   # two of them named as the search's own fields
RRF_K, LEG_ROWS = 60, 40                          # configs/pipeline.yaml's search: defaults
CJK = "向量搜索 段落 数据库 检索 结果"
EMOJI = "🚀 ракета 🚀 rocket 👨‍👩‍👧 family"


def passages(n: int = 80, seed: int = 5) -> list[dict]:
    """N English passages of the test vocabulary (each word's count varies, so the text leg's
    scores do), some Russian, one Chinese, one with emoji; kept columns of four types."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        lang, words = ("ru", WORDS_RU) if i % 8 == 7 else ("en", WORDS_EN)
        rows.append({"id": f"p-{i}", "text": paragraph(rng, words, rng.randint(4, 30)), "lang": lang,
                     "similarity": round(rng.random(), 3), "score": i, "day": dt.date(2026, 1, 1 + i % 28)})
    rows.append({"id": "zh-1", "text": CJK, "lang": "zh", "similarity": 0.5, "score": n, "day": dt.date(2026, 2, 1)})
    rows.append({"id": "emoji-1", "text": EMOJI, "lang": "mixed", "similarity": 0.25, "score": n + 1,
                 "day": dt.date(2026, 2, 2)})
    return rows


def write_passages(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def published_passages(days, url: str, rows: list[dict] | None = None) -> list[dict]:
    """ROWS (passages() by default) run into days' DIR with the kept columns, and published to URL."""
    rows = passages() if rows is None else rows
    corpus = write_passages(days.out.parent / "passages.parquet", rows)
    assert days.run_file(corpus, "--keep-columns", ",".join(KEPT)) == 0
    assert publish(days.out, url) == 0
    return rows


def search_json(capsys, days, url: str, *args: str) -> dict:
    """`search DIR ARGS --json` on URL's table: its report (exit 0)."""
    capsys.readouterr()
    assert main(["search", str(days.out), *args, "--to", url, "--base-url", days.base_url,
                 "--models-config", str(days.models), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def query_vector(text: str, dims: int, full: int | None = None) -> str:
    """TEXT's vector as the sandbox embeds it for MODEL, as pgvector's text."""
    return "[" + ",".join(repr(float(x)) for x in embed_batch(MODEL, [text], dims, full)[0]) + "]"


def legs(url: str, text: str, vector: str, config: str = "simple", table: str = "embeddings",
         where: str = "TRUE", depth: int = LEG_ROWS) -> tuple[list[str], list[str]]:
    """The two legs' rankings of chunk ids, DEPTH each: every row's exact cosine distance (no
    index), every matching row's ts_rank_cd; ties by chunk_id."""
    name = sql.Identifier(table)
    with psycopg.connect(url) as conn:
        conn.execute("SET enable_indexscan = off")
        conn.execute("SET enable_bitmapscan = off")
        by_vector = [r[0] for r in conn.execute(
            sql.SQL("SELECT chunk_id FROM {} WHERE {} ORDER BY embedding <=> %s::vector, chunk_id LIMIT %s").format(
                name, sql.SQL(where)), (vector, depth))]
        by_text = [r[0] for r in conn.execute(
            sql.SQL("SELECT chunk_id FROM {} WHERE {} AND text_tsv @@ websearch_to_tsquery(%s::regconfig, %s) "
                    "ORDER BY ts_rank_cd(text_tsv, websearch_to_tsquery(%s::regconfig, %s)) DESC, chunk_id "
                    "LIMIT %s").format(name, sql.SQL(where)), (config, text, config, text, depth))]
    return by_vector, by_text


def fused(by_vector: list[str], by_text: list[str], k: int, rrf_k: int = RRF_K) -> list[tuple[str, int | None, int | None]]:
    """Reciprocal rank fusion of two rankings, by hand: (chunk id, vector rank, text rank) of the
    best K; ties to the better vector rank, then the better text rank."""
    v = {c: i for i, c in enumerate(by_vector, 1)}
    t = {c: i for i, c in enumerate(by_text, 1)}
    score = {c: (1 / (rrf_k + v[c]) if c in v else 0) + (1 / (rrf_k + t[c]) if c in t else 0) for c in {*v, *t}}
    big = 1 << 30
    order = sorted(score, key=lambda c: (-score[c], v.get(c, big), t.get(c, big)))
    return [(c, v.get(c), t.get(c)) for c in order[:k]]


def ranking(report: dict) -> list[tuple[str, int | None, int | None]]:
    return [(r["chunk_id"], r["vector_rank"], r["text_rank"]) for r in report["results"]]


DOC = Path(__file__).resolve().parents[2] / "docs" / "postgres.md"
HYBRID_MARK = "<!-- hybrid-sql -->"


def doc_statement() -> str:
    """The hybrid statement docs/postgres.md gives, as written (the ```sql block after its mark)."""
    lines = DOC.read_text(encoding="utf-8").splitlines()
    start = lines.index(HYBRID_MARK) + 1
    assert lines[start] == "```sql", "the hybrid statement's mark must precede a ```sql block"
    end = lines.index("```", start + 1)
    return "\n".join(lines[start + 1:end])


def doc_ranking(url: str, words: str, vector: str) -> list[tuple[str, int | None, int | None]]:
    """The doc's statement run as an application runs it ($1 the vector, $2 the words): (chunk
    id, vector rank, text rank) of each row."""
    with psycopg.connect(url) as conn:
        cur = psycopg.RawCursor(conn).execute(doc_statement(), (vector, words))
        at = {d.name: i for i, d in enumerate(cur.description or ())}
        return [(r[at["chunk_id"]], r[at["vector_rank"]], r[at["text_rank"]]) for r in cur.fetchall()]
