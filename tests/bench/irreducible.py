"""The client-side work no embedding job can avoid on a corpus, each part timed in CPU seconds
of this process (all its threads), each done the cheapest way we know: tokenising the
documents once (encode_ordinary_batch on tiktoken's threads, encode_ordinary and
encode_to_numpy in one thread: the cheapest counts), parsing the JSON answers and
base64-decoding their vectors into one buffer, writing the same Parquet. Keys starting with
"_" are figures shown beside the total, not part of it."""
from __future__ import annotations

import base64
import binascii
import json
import resource
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from service.tokenizer import get_encoding

ANSWER_INPUTS = 2048   # vectors per answer, as the pipeline packs them
TOKENISE_BATCH = "tokenise (encode_ordinary_batch, tiktoken's 8 threads)"
TOKENISE_ONE = "tokenise (encode_ordinary, one thread)"
TOKENISE_NUMPY = "tokenise (encode_to_numpy, one thread)"


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _answers(matrix: np.ndarray) -> list[bytes]:
    """The service's base64 answers for these vectors (built untimed)."""
    out = []
    for start in range(0, len(matrix), ANSWER_INPUTS):
        part = matrix[start:start + ANSWER_INPUTS].astype("<f4")
        data = [{"object": "embedding", "index": i, "embedding": base64.b64encode(v.tobytes()).decode()}
                for i, v in enumerate(part)]
        out.append(json.dumps({"object": "list", "data": data, "model": "m",
                               "usage": {"prompt_tokens": 1, "total_tokens": 1}}).encode())
    return out


def measure(corpus: Path, embeddings: list[Path], codec: str = "zstd") -> dict[str, float]:
    texts = pq.read_table(corpus, columns=["text"]).column("text").to_pylist()
    table = pa.concat_tables([pq.read_table(p) for p in embeddings])
    dims = table.schema.field("embedding").type.list_size
    matrix = table.column("embedding").combine_chunks().flatten().to_numpy().reshape(-1, dims)
    answers = _answers(matrix)
    encoding = get_encoding()
    encoding.encode_ordinary("warm up")
    out: dict[str, float] = {}

    ways = {TOKENISE_BATCH: lambda: sum(map(len, encoding.encode_ordinary_batch(texts))),
            TOKENISE_ONE: lambda: sum(len(encoding.encode_ordinary(text)) for text in texts),
            TOKENISE_NUMPY: lambda: sum(len(encoding.encode_to_numpy(text, disallowed_special=()))
                                        for text in texts)}
    spent = {}
    for name, tokenise in ways.items():
        t = _cpu()
        tokens = tokenise()
        spent[name] = _cpu() - t
    # the cheapest counts as irreducible; the others are shown for comparison
    cheapest = min(spent, key=spent.get)
    out[cheapest] = spent[cheapest]
    out.update({"_" + name: cpu for name, cpu in spent.items() if name != cheapest})

    t = _cpu()
    docs = [json.loads(a) for a in answers]
    out["JSON parse of the answers"] = _cpu() - t

    t = _cpu()
    for doc in docs:
        vectors = [item["embedding"] for item in doc["data"]]
        width = 4 * dims
        raw = bytearray(width * len(vectors))
        view = memoryview(raw)
        for row, text in enumerate(vectors):
            view[row * width:(row + 1) * width] = binascii.a2b_base64(text)
        np.frombuffer(raw, dtype="<f4").reshape(len(vectors), dims)
    out["base64 decode of the vectors"] = _cpu() - t

    with tempfile.TemporaryDirectory() as tmp:
        t = _cpu()
        # as cheaply as it can be written: no dictionary attempt or statistics on the vectors
        scalars = [f.name for f in table.schema if not pa.types.is_fixed_size_list(f.type)]
        pq.write_table(table, Path(tmp) / "embeddings.parquet", compression=codec,
                       use_dictionary=scalars, write_statistics=scalars)
        out[f"write the embeddings Parquet ({codec})"] = _cpu() - t
    out["_tokens"] = tokens
    return out
