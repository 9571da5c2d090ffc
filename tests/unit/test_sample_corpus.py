import json
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.corpora.sample import EMOJI_CJK, SPECIAL_TOKENS, main, write_sample_corpus
from service.tokenizer import get_encoding


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "sample.parquet"
    counts = write_sample_corpus(str(path), n_docs=300, seed=3)
    return counts, pq.read_table(path)


def test_deterministic_for_a_seed(corpus, tmp_path):
    counts, table = corpus
    assert write_sample_corpus(str(tmp_path / "again.parquet"), n_docs=300, seed=3) == counts
    assert pq.read_table(tmp_path / "again.parquet").equals(table)
    write_sample_corpus(str(tmp_path / "other.parquet"), n_docs=300, seed=4)
    assert not pq.read_table(tmp_path / "other.parquet").equals(table)


def test_schema_and_counts(corpus):
    counts, table = corpus
    assert table.schema == pa.schema([(c, pa.string()) for c in ("id", "text", "lang", "source")])
    assert table.num_rows == counts["rows"] == 300
    langs = Counter(table.column("lang").to_pylist())
    assert {lang: n for lang, n in langs.items()} == {
        k.removeprefix("lang_"): v for k, v in counts.items() if k.startswith("lang_") and v}


def test_has_the_advertised_bad_rows(corpus):
    counts, table = corpus
    texts = table.column("text").to_pylist()
    ids = Counter(table.column("id").to_pylist())
    assert texts.count(None) == texts.count("") == 1
    assert sum(1 for t in texts if t and t.isspace()) == 1
    assert [n for n in ids.values() if n > 1] == [2]
    assert texts.count(SPECIAL_TOKENS) == texts.count(EMOJI_CJK) == 1
    assert counts["expected_failed_rows"] == 5
    repeated = Counter(t for t in texts if t and t not in (SPECIAL_TOKENS, EMOJI_CJK))
    assert sum(n - 1 for n in repeated.values() if n > 1) == counts["duplicate_texts"] > 0


def test_languages_lengths_and_content(corpus):
    counts, table = corpus
    rows = [r for r in table.to_pylist() if r["text"]]
    by_lang = {lang: [r["text"] for r in rows if r["lang"] == lang]
               for lang in ("en", "ru", "python", "sql", "js")}
    assert all(by_lang.values())
    assert all(any("\u0400" <= ch <= "\u04ff" for ch in t) for t in by_lang["ru"])
    assert any("def " in t or "class " in t for t in by_lang["python"])
    assert any("SELECT" in t for t in by_lang["sql"])
    assert any("=>" in t or "const " in t for t in by_lang["js"])
    tokens = sorted(len(get_encoding().encode_ordinary(r["text"])) for r in rows)
    assert tokens[0] <= 20                     # a sentence
    assert tokens[-counts["long_docs"]] > 2 * 8191   # the long ones span several chunks


def test_clean_corpus_and_too_few_rows(tmp_path):
    path = tmp_path / "clean.parquet"
    counts = write_sample_corpus(str(path), n_docs=50, seed=1, bad_rows=False, long_docs=0)
    table = pq.read_table(path)
    assert counts["expected_failed_rows"] == 0 and table.num_rows == 50
    assert all(t and not t.isspace() for t in table.column("text").to_pylist())
    assert len(set(table.column("id").to_pylist())) == 50
    with pytest.raises(ValueError):
        write_sample_corpus(str(path), n_docs=5)


def test_cli(tmp_path, capsys):
    out = tmp_path / "cli.parquet"
    assert main([str(out), "--docs", "40", "--seed", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == pq.read_table(out).num_rows == 40
    assert main([str(out), "--docs", "3"]) == 2
