"""LangChain's PGVectorStore (langchain-postgres, v2 API) on a table embedpipe published, as
docs/postgres.md shows it; run by tests/interop/test_langchain.py in .venv-interop:

    python langchain_search.py REQUEST.json     # prints one JSON object

REQUEST: the SQLAlchemy URL, the table, its kept columns, the leg depth and the fusion's k, and
queries (words, and the vector embedpipe's model gives them: the store's embedding service
answers it, so nothing here calls a service). Per query, the vector search's documents and the
hybrid search's (on NAME's text_tsv), each as id, page_content and metadata.
"""
from __future__ import annotations

import json
import sys

from langchain_core.embeddings import Embeddings
from langchain_postgres import PGEngine, PGVectorStore
from langchain_postgres.v2.hybrid_search_config import HybridSearchConfig, reciprocal_rank_fusion


class Given(Embeddings):
    """The vector of each query as embedpipe's model gave it."""

    def __init__(self, vectors: dict[str, list[float]]):
        self.vectors = vectors

    def embed_query(self, text: str) -> list[float]:
        return self.vectors[text]

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self.vectors[t] for t in texts]


def main(request: dict) -> dict:
    engine = PGEngine.from_connection_string(request["url"])
    store = PGVectorStore.create_sync(
        engine, embedding_service=Given({q["words"]: q["vector"] for q in request["queries"]}),
        table_name=request["table"], id_column="chunk_id", content_column="text", embedding_column="embedding",
        metadata_columns=request["kept"], metadata_json_column=None)

    def hybrid(words: str) -> HybridSearchConfig:
        # one per search: langchain-postgres 0.0.19 keeps the first search's words in a config
        # it is given (langchain-postgres#337); ranks count from 0 there, so its rrf_k is one less
        return HybridSearchConfig(tsv_column="text_tsv", tsv_lang=request["config"], fts_query=words,
                                  fusion_function=reciprocal_rank_fusion,
                                  fusion_function_parameters={"rrf_k": request["rrf_k"] - 1},
                                  primary_top_k=request["leg_rows"], secondary_top_k=request["leg_rows"])

    def shown(docs) -> list[dict]:
        return [{"id": d.id, "page_content": d.page_content, "metadata": d.metadata} for d in docs]

    out = {}
    for q in request["queries"]:
        k = request["k"]
        out[q["words"]] = {"vector": shown(store.similarity_search(q["words"], k=k)),
                           "hybrid": shown(store.similarity_search(q["words"], k=k,
                                                                   hybrid_search_config=hybrid(q["words"])))}
    return out


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        print(json.dumps(main(json.load(f)), default=str))
