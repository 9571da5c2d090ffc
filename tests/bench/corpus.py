"""The benchmark corpus: deterministic, realistic text, mixed lengths.

Text comes from sources every Python install has (the English prose of pydoc's topics, the
standard library's source code) plus generated Russian, so tokenisation costs what it costs
on real documents. Lengths: mostly short documents (notes, abstracts, messages), a fifth of
medium ones, and 1% long ones of two to four 8191-token chunks. Every document starts with
its own id line, so no two texts are equal and in-run dedup does not flatter the pipeline.
"""
from __future__ import annotations

import functools
import sysconfig
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

# (share of documents, token range drawn log-uniformly)
LENGTHS = ((0.79, (20, 400)), (0.20, (400, 1600)), (0.01, (9_000, 30_000)))
# (share, kind, characters per token of cl100k on that kind, roughly)
KINDS = ((0.75, "prose", 4.3), (0.15, "code", 3.4), (0.10, "ru", 2.6))
_RU = ("данные вектор бюджет запрос модель текст поиск рубль строка колонка документ система "
       "работа время результат задача значение процесс пример файл сервер клиент ответ ошибка "
       "число список пользователь таблица поле метод функция объект класс параметр версия "
       "обработка хранение сеть доступ ключ счёт оплата расход месяц день отчёт анализ качество "
       "скорость память диск ядро поток очередь сообщение событие журнал проверка тест").split()
_RU_GLUE = "и в на с по для из не что как это при от до".split()


@functools.cache
def _prose() -> str:
    import pydoc_data.topics
    return "\n\n".join(pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics))


@functools.cache
def _code() -> str:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for d in ("json", "email", "asyncio", "http", "importlib", "logging", "unittest")
                   for p in (root / d).glob("*.py"))
    return "\n\n".join(p.read_text(encoding="utf-8", errors="replace") for p in files)


def _span(source: str, rng: np.random.Generator, n_chars: int) -> str:
    """About n_chars of SOURCE from a random place, starting and ending at a line or word."""
    if n_chars >= len(source):
        reps = n_chars // len(source) + 1
        return _span(source * reps, rng, n_chars)
    start = int(rng.integers(0, len(source) - n_chars))
    nl = source.find("\n", start, start + 200)
    start = nl + 1 if nl != -1 else start
    end = start + n_chars
    space = source.rfind(" ", end - 100, end)
    return source[start:space if space > start else end].strip()


def _russian(rng: np.random.Generator, n_chars: int) -> str:
    n_words = max(3, n_chars // 8)
    words = rng.choice(_RU + _RU_GLUE * 2, size=n_words)
    ends = rng.random(n_words) < 0.1
    out, sentence = [], []
    for w, end in zip(words, ends, strict=True):
        sentence.append(w)
        if end or len(sentence) > 25:
            out.append(" ".join(sentence).capitalize() + ".")
            sentence = []
    if sentence:
        out.append(" ".join(sentence).capitalize() + ".")
    return " ".join(out)


def make_documents(n_docs: int, seed: int = 20250101) -> list[dict]:
    rng = np.random.default_rng(seed)
    length_p = [p for p, _ in LENGTHS]
    kind_p = [p for p, _, _ in KINDS]
    docs = []
    for i in range(n_docs):
        lo, hi = LENGTHS[rng.choice(len(LENGTHS), p=length_p)][1]
        tokens = float(np.exp(rng.uniform(np.log(lo), np.log(hi))))
        _, kind, chars_per_token = KINDS[rng.choice(len(KINDS), p=kind_p)]
        n_chars = int(tokens * chars_per_token)
        body = (_span(_prose(), rng, n_chars) if kind == "prose" else
                _span(_code(), rng, n_chars) if kind == "code" else _russian(rng, n_chars))
        docs.append({"id": f"doc-{i:06d}", "text": f"Document {i} ({kind})\n{body}", "kind": kind})
    return docs


SCHEMA = pa.schema([("id", pa.string()), ("text", pa.string()), ("kind", pa.string())])


def write_corpus(path: Path, n_docs: int, seed: int = 20250101) -> list[dict]:
    """Write the corpus to PATH (one file, row groups of 2000) and return its rows."""
    docs = make_documents(n_docs, seed)
    pq.write_table(pa.Table.from_pylist(docs, schema=SCHEMA), path, row_group_size=2000,
                   compression="zstd")
    return docs
