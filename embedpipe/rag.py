"""Type adapters: what ServiceTextEmbeddings reads from and writes back to each element.

An element's result (`Embedded`) carries its vector, tokens, cost share and request, or why it
was not embedded. Beam's ml.rag items (EmbeddableItem / Chunk) get the vector as their dense
embedding and the rest in their metadata (their text stays in their content); dicts get the
vector in each column, the text it was paid for in `<column>_text` (output.chunk_text), and on
failure None there and the reason in `<column>_error`. Module-level functions: MLTransform's artifacts
(jsonpickle) name them, never copy them.
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple
from collections.abc import Sequence

import apache_beam as beam
import numpy as np
from apache_beam.ml.rag.types import Embedding
from apache_beam.ml.transforms.base import EmbeddingTypeAdapter

TOKENS, COST, REQUEST, ERROR = "embedpipe_tokens", "embedpipe_cost_rub", "embedpipe_request_id", "embedpipe_error"


class Embedded(NamedTuple):
    vector: np.ndarray | None   # float32; None when not embedded
    n_tokens: int
    cost_rub: float             # this element's share of its request (0 for a text met before)
    request_id: str | None
    error: str | None = None    # reason code when not embedded
    detail: str | None = None
    text: str | None = None     # the text sent for the vector (None: output.chunk_text false)


def _text(value: Any) -> str:
    """What is sent for a value: a str as it is; anything else is no text (a dead letter)."""
    return value if isinstance(value, str) else ""


def item_texts(items: Sequence[Any]) -> list[str]:
    return [_text(item.content.text) for item in items]


def items_embedded(items: Sequence[Any], results: Sequence[Embedded]) -> list[Any]:
    for item, r in zip(items, results, strict=True):
        if r.vector is not None:
            item.embedding = Embedding(dense_embedding=r.vector.tolist())
            item.metadata.update({TOKENS: r.n_tokens, COST: r.cost_rub, REQUEST: r.request_id})
        else:
            item.metadata.update({ERROR: r.error, f"{ERROR}_detail": r.detail})
    return list(items)


def _as_dict(row: Any) -> dict[str, Any] | None:
    """A dict, or a beam.Row as one (MLTransform takes both); None for anything else."""
    if isinstance(row, dict):
        return row
    return row._asdict() if hasattr(row, "_asdict") else None


def dict_texts(columns: Sequence[str], rows: Sequence[Any]) -> list[str]:
    return [_text((_as_dict(row) or {}).get(col)) for row in rows for col in columns]


def dicts_embedded(columns: Sequence[str], rows: Sequence[Any], results: Sequence[Embedded]) -> list[Any]:
    out = []
    for i, element in enumerate(rows):
        row = dict(_as_dict(element) or {"element": element})
        for j, col in enumerate(columns):
            r = results[i * len(columns) + j]
            row[col] = r.vector
            if r.vector is None:
                row[f"{col}_error"] = r.error
            elif r.text is not None:
                row[f"{col}_text"] = r.text
        out.append(beam.Row(**row) if hasattr(element, "_asdict") and not isinstance(element, dict) else row)
    return out


def rag_adapter() -> EmbeddingTypeAdapter[Any, Any]:
    """For Beam's ml.rag items (EmbeddableItem, Chunk): embedding and metadata filled in."""
    return EmbeddingTypeAdapter(input_fn=item_texts, output_fn=items_embedded)


def dict_adapter(columns: Sequence[str]) -> EmbeddingTypeAdapter[Any, Any]:
    columns = list(columns)
    return EmbeddingTypeAdapter(input_fn=functools.partial(dict_texts, columns),
                                output_fn=functools.partial(dicts_embedded, columns))


def element_texts(columns: Sequence[str] | None, element: Any) -> list[str]:
    """The texts of one element, for batching by tokens."""
    if columns is None:
        return [_text(getattr(getattr(element, "content", None), "text", None))]
    return dict_texts(columns, [element])
