"""embedpipe as a library: the CLI job's steps inside your own Beam pipeline.

Public names:
- `EmbedTexts(model, base_url, *, api_key_env, api_key_file, max_spend_rub, id_field,
  text_field, store, read_stores)`: dicts -> `EmbedResult` (`.embeddings`, `.failed`,
  `.pending`, `.requests`), with the job's token-exact splitting, packing, adaptive in-flight
  limit, retries, budget guard, per-row cost lineage and each distinct text paid once; with a
  store, once ever (reruns, retried bundles, later runs).
- `compact_store(path)`: merges a store's entries into large files (`python -m embedpipe.compact`).
- `ServiceTextEmbeddings(columns, model, base_url, *, max_spend_rub, store, read_stores, ...)`:
  an EmbeddingsManager for MLTransform; with `columns=None`, for Beam's ml.rag items
  (`rag_adapter()`); each text paid once per worker (and once ever with a store), a text over
  the model's limit split and given the token-weighted mean of its pieces.
- `Embedded`: what each ml.rag item or dict column gets back; `rag_adapter`, `dict_adapter`.
- Re-exported from the job: `EmbeddingsClient`, `RetryPolicy`, `EmbeddingsError`,
  `MissingApiKeyError`, `KeySource`, `ModelSpec`, `load_models`, `Splitter`, `SplitConfig`,
  `Packer`.

The user guide is docs/library.md.
"""
from embedpipe.mltransform import ServiceModelHandler, ServiceTextEmbeddings
from embedpipe.rag import Embedded, dict_adapter, rag_adapter
from embedpipe.store import compact_store
from embedpipe.texts import EmbedResult, EmbedTexts
from service.catalog import ModelSpec, load_models
from service.client import EmbeddingsClient, RetryPolicy
from service.credentials import KeySource, MissingApiKeyError
from service.errors import EmbeddingsError
from transforms.pack import Packer
from transforms.read.split import SplitConfig, Splitter

__all__ = ["EmbedTexts", "EmbedResult", "compact_store", "ServiceTextEmbeddings", "ServiceModelHandler", "Embedded", "rag_adapter",
           "dict_adapter", "EmbeddingsClient", "RetryPolicy", "EmbeddingsError", "MissingApiKeyError", "KeySource",
           "ModelSpec", "load_models", "Splitter", "SplitConfig", "Packer"]
