"""Makes tests/e2e/data/dir_before_text/: an output DIR as embedpipe wrote it before embeddings
rows carried their chunk's text (commit cc16cb9), with its corpus and model catalogue. Run it
with that commit's code on the path, from a checkout of it:

    git archive cc16cb9 | tar -x -C /tmp/old && cd /tmp/old && \\
        python /path/to/make_dir_before_text.py /path/to/tests/e2e/data

A first run stopped by its cap (exit 4): embedded rows without `text`, pending rows (which
always had it), a failed row. tests/e2e/test_text.py copies the DIR and runs the current code on it.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from pipeline.cli import main
from service.catalog import load_models
from service.sandbox.launcher import SandboxProcess

MODEL, KEY = "text-embedding-3-small", "sk-before-text"
ROWS = [
    {"id": "en-long", "lang": "en", "text": "\n\n".join(
        f"Paragraph {i} of a long document. It has sentences of plain words, and a second one here. "
        f"The budget stops the run somewhere in paragraph {i + 1}." for i in range(8))},
    {"id": "ru", "lang": "ru", "text": "Данные идут в вектор. Бюджет ограничивает запрос, модель считает "
                                       "токены. Строка за строкой, колонка за колонкой: поиск находит текст."},
    {"id": "zh", "lang": "zh", "text": "向量数据库保存每个段落的文本。搜索时显示段落，而不是重新读取语料库。" * 3},
    {"id": "emoji", "lang": "en", "text": "Weather 🌦️ then 🌈 and a family 👨‍👩‍👧‍👦 on a walk. " * 4},
    {"id": "short", "lang": "en", "text": "A short document."},
    {"id": "shared", "lang": "en", "text": "A short document."},
    {"id": "empty", "lang": "en", "text": ""},
    {"id": "word", "lang": "en", "text": "Pneumonoultramicroscopicsilicovolcanoconiosis" * 12},
]


def write_models(path: Path) -> None:
    doc = {"models": {n: {k: v for k, v in dataclasses.asdict(m).items() if k != "name"}
                      for n, m in load_models().items()}}
    doc["models"][MODEL].update(max_input_tokens=48, max_inputs_per_request=4, max_tokens_per_request=128,
                                dimensions=8, price_rub_per_1m_tokens=100.0)
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")


def main_(data: Path) -> int:
    out, work = data / "dir_before_text", data / "work"
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    corpus, models = data / "before_text_corpus.parquet", data / "before_text_models.yaml"
    pq.write_table(pa.Table.from_pylist(ROWS, schema=pa.schema([("id", pa.string()), ("text", pa.string()),
                                                                 ("lang", pa.string())])), corpus)
    write_models(models)
    with SandboxProcess(work / "sandbox.db", key=KEY, balance=100.0, args=["--models", str(models)]) as sb:
        os.environ["EMBEDDINGS_API_KEY"] = KEY
        code = main(["run", "--input", str(corpus), "--output", str(out), "--model", MODEL, "--base-url",
                     sb.base_url, "--models-config", str(models), "--keep-columns", "lang",
                     "--max-spend-rub", "0.03", "--allow-partial"])
    shutil.rmtree(work)
    print("exit", code)
    return 0 if code == 4 else 1


if __name__ == "__main__":
    sys.exit(main_(Path(sys.argv[1])))
