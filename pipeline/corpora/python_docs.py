"""The demo corpus: real text that ships offline with every Python, the language reference
topics of the standard library's `pydoc_data.topics` (what `help("for")` prints), cut into
passages of a few paragraphs each.

Columns: id (`topic:n`, n counting the topic's passages from 0), text, topic (kept-columns
demo).
"""
from __future__ import annotations

import re
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

PASSAGE_CHARS = 1200   # paragraphs are joined until a passage reaches this: a few hundred tokens


def _topics() -> dict[str, str]:
    from pydoc_data.topics import topics
    return topics


def passages(min_chars: int = PASSAGE_CHARS) -> list[dict[str, Any]]:
    """Each topic's paragraphs, joined in order into passages of at least MIN_CHARS (a topic's
    last passage may be shorter)."""
    rows = []
    for topic, text in sorted(_topics().items()):
        groups, current = [], []
        for paragraph in (p.strip("\n") for p in re.split(r"\n\s*\n", text)):
            if paragraph.strip():
                current.append(paragraph)
            if current and sum(map(len, current)) >= min_chars:
                groups.append(current)
                current = []
        if current:
            groups.append(current)
        rows += [{"id": f"{topic}:{n}", "text": "\n\n".join(g), "topic": topic} for n, g in enumerate(groups)]
    return rows


def write_python_docs_corpus(path: str) -> dict[str, Any]:
    rows = passages()
    schema = pa.schema([("id", pa.string()), ("text", pa.string()), ("topic", pa.string())])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return {"passages": len(rows), "topics": len({r["topic"] for r in rows}),
            "characters": sum(len(r["text"]) for r in rows)}
