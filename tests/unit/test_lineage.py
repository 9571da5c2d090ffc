"""Properties of lineage.embeddings_table: the rows of one request sum exactly to its cost,
rows that share a text split that text's share, vectors and kept values follow their rows,
and the table has exactly the schema it was given."""
from __future__ import annotations

import datetime as dt
import hashlib

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from transforms import schemas
from transforms.money.apportion import apportion_micro
from transforms.money.lineage import embeddings_table
from transforms.records import ChunkRef, TextItem

DIMS = 4
KEPT = (pa.field("lang", pa.string()),)
SCHEMA = schemas.embeddings(DIMS, KEPT, schemas.metadata("m", None, "run-1"))
WHEN = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


@st.composite
def requests(draw):
    """Up to 4 requests: (request_id, cost_micro, [TextItem]) with distinct texts and rows."""
    out, doc = [], 0
    for r in range(draw(st.integers(1, 4))):
        items = []
        for _ in range(draw(st.integers(1, 6))):
            n_tokens = draw(st.integers(1, 600))
            refs = []
            for _ in range(draw(st.integers(1, 4))):       # rows sharing this text
                doc += 1
                refs.append(ChunkRef(f"d{doc}", 0, 1, 0, n_tokens, n_tokens, (draw(st.sampled_from(["en", "ru"])),)))
            sha = hashlib.sha256(f"text {doc}".encode()).hexdigest()
            items.append(TextItem(sha, f"text {doc}", n_tokens, tuple(refs)))
        out.append((f"req-{r}", draw(st.integers(0, 10**7)), items))
    return out


def build(reqs):
    items, ids, shares = [], [], []
    for request_id, cost, its in reqs:
        items += its
        ids += [request_id] * len(its)
        shares += apportion_micro(cost, [i.n_tokens for i in its])
    vectors = np.arange(len(items) * DIMS, dtype=np.float32).reshape(len(items), DIMS)
    return items, vectors, shares, embeddings_table(items, vectors, ids, shares, SCHEMA, "m", "run-1", KEPT, WHEN)


@settings(deadline=None, max_examples=200)
@given(requests())
def test_rows_of_a_request_sum_to_its_cost(reqs):
    *_, table = build(reqs)
    per_request = {request_id: 0 for request_id, _, _ in reqs}
    for request_id, cost in zip(table.column("request_id").to_pylist(), table.column("cost_rub").to_pylist(), strict=True):
        assert cost >= 0
        per_request[request_id] += round(cost * 1e6)
    assert per_request == {request_id: cost for request_id, cost, _ in reqs}


@settings(deadline=None, max_examples=200)
@given(requests())
def test_rows_sharing_a_text_split_its_share(reqs):
    items, vectors, shares, table = build(reqs)
    rows = table.to_pylist()
    assert len(rows) == sum(len(i.refs) for i in items)
    for index, (item, share) in enumerate(zip(items, shares, strict=True)):
        mine = [r for r in rows if r["text_sha256"] == item.text_sha256]
        assert [r["doc_id"] for r in mine] == [ref.doc_id for ref in item.refs]
        micro = [round(r["cost_rub"] * 1e6) for r in mine]
        assert sum(micro) == share
        assert max(micro) - min(micro) <= 1
        for r, ref in zip(mine, item.refs, strict=True):
            assert r["embedding"] == vectors[index].tolist()
            assert r["lang"] == ref.kept[0] and r["n_tokens"] == ref.n_tokens
            assert r["model"] == "m" and r["run_id"] == "run-1" and r["embedded_at"] == WHEN


@settings(deadline=None, max_examples=50)
@given(requests())
def test_schema_is_the_one_given(reqs):
    *_, table = build(reqs)
    assert table.schema.equals(SCHEMA, check_metadata=True)
    assert table.schema.field("embedding").type == schemas.vector_type(DIMS)
