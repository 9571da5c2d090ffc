"""The demo corpus: real text that ships offline with every Python, the language reference
topics of the standard library's `pydoc_data.topics` (what `help("for")` prints), one document
a topic, whole: the job cuts them into passages (`--chunk-tokens`).

Columns: id (the topic), text, topic (kept-columns demo).
"""
from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq


def topics() -> list[dict[str, Any]]:
    """One row per topic, its whole text."""
    from pydoc_data.topics import topics
    return [{"id": topic, "text": text, "topic": topic} for topic, text in sorted(topics.items())]


def write_python_docs_corpus(path: str) -> dict[str, Any]:
    rows = topics()
    schema = pa.schema([("id", pa.string()), ("text", pa.string()), ("topic", pa.string())])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return {"topics": len(rows), "characters": sum(len(r["text"]) for r in rows)}
