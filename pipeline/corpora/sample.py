"""The benchmark and test corpus (the demo's is python_docs_corpus): a deterministic Parquet
file of English, Russian and source code, from built-in vocabularies (no downloads), with the
rows a real corpus brings.

Columns: id, text, lang (en, ru, python, sql, js, mul), source (kept-columns demo). Lengths
run from one sentence to tens of thousands of tokens (several 8191-token chunks); some texts
repeat under other ids (in-run dedup). With bad_rows: a null text, an empty text, a
whitespace-only text, two rows sharing one id, a text of only special-token strings (plain
text to the tokenizer), an emoji/CJK text. A lone surrogate cannot be stored in an Arrow
string, so it is not among them.

    python -m pipeline.corpora.sample OUT.parquet --docs 300 --seed 0
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

_EN = np.array("""
the of and to in is that for it as was with be by on not he this are or his from at which but
have an they you were her she there been one all we their has would when if so no out what up
said its about than into them can only other new some could time these two may then do first
any my now such like our over man me even most made after also did many before must through
back years where much your way well down should because each just those people how too little
state good very make world still own see men work long here get both between life being under
never day same another know while last might us great old year off come since against go came
right used take three states himself few house use during without again place around however
home small found thought went say part once general high upon school every does got united left
number course war until always away something fact though water less public put think almost
hand enough far took head yet government system better set told nothing night end why called
didn't eyes find going look asked later knew point next program city business give group toward
young days let room president side social given present several order national possible rather
second face per among form important often things looked early white case john become large big
need four within felt along children saw best church ever least power development light thing
seemed family interest want members mind country area others done turned although open problem
corpus vector budget request model token chunk pipeline batch service cost balance ledger query
index embedding cluster worker runner parquet column schema record journal retry backoff limit
price invoice account report summary dataset document paragraph sentence language search rank
""".split(), dtype=object)

_RU = np.array("""
и в не на я быть он с что а по это она этот к но они мы как из у который то за свой весь год
от так о для ты же все тот мочь вы человек такой его сказать только или ещё бы себя один как
уже до время если сам когда другой вот говорить наш мой знать стать при чтобы дело жизнь кто
первый очень два день её новый рука даже во со раз где там под можно ну какой после их работа
без самый потом надо хотеть ли слово идти большой должен место иметь ничто то сейчас тут лицо
каждый друг нет теперь ни глаз тоже тогда видеть вопрос через да здесь дом да сторона какой-то
думать сделать страна жить чем мир об последний случай голова более делать что-то смотреть
ребёнок просто конечно сила российский конец перед несколько вид система всегда русский
данные вектор бюджет запрос модель текст поиск рубль строка колонка документ обработка
хранение сеть доступ ключ счёт оплата расход месяц отчёт анализ качество скорость память
диск ядро поток очередь сообщение событие журнал проверка тест сервер клиент ответ ошибка
число список пользователь таблица поле метод функция объект класс параметр версия результат
задача значение процесс пример файл фрагмент стоимость баланс лимит повтор пакет индекс
кластер узел задание выгрузка загрузка источник приёмник схема запись чтение фильтр порядок
""".split(), dtype=object)

_IDENTS = np.array("""
rows batch chunk doc text vectors cost total price model client request response result items
index offset limit count tokens buffer record key value path name data frame table query user
account budget balance ledger retry attempt delay timeout worker queue task job run step config
""".split(), dtype=object)

_PYTHON = [
    'def {a}_{b}({c}, {d}=None):\n    """Return the {b} of {c}."""\n    {e} = [{f} for {f} in {c} if {f}]\n'
    '    return {e} if {d} is None else {e}[:{d}]\n',
    'class {A}{B}:\n    def __init__(self, {c}):\n        self.{c} = {c}\n        self.{d} = {{}}\n\n'
    '    def {e}(self, {f}):\n        return self.{d}.setdefault({f}, len(self.{c}))\n',
    'for {a}, {b} in enumerate({c}):\n    if {b} > {n}:\n        {d}.append({a})\n    else:\n'
    '        {e} += {b} * {n}\n',
    'try:\n    {a} = {b}.get("{c}", {n})\nexcept KeyError as exc:\n    raise ValueError(f"missing {c}: {{exc}}")\n',
    'with open({a}_path, encoding="utf-8") as {b}:\n    {c} = [line.rstrip("\\n") for line in {b}]\n',
]
_SQL = [
    "SELECT {a}, count(*) AS {b}_count, sum({c}) AS total_{c}\nFROM {d}\nWHERE {e} > {n}\n"
    "GROUP BY {a}\nORDER BY {b}_count DESC\nLIMIT {n};\n",
    "INSERT INTO {a} ({b}, {c}, {d}) VALUES ({n}, '{e}', now());\n",
    "UPDATE {a} SET {b} = {b} + {n} WHERE {c} = '{d}' AND {e} IS NOT NULL;\n",
    "CREATE TABLE {a}_{b} (\n    id bigint PRIMARY KEY,\n    {c} text NOT NULL,\n    {d} numeric(12, 6)\n);\n",
    "SELECT t.{a}, u.{b}\nFROM {c} AS t\nJOIN {d} AS u ON u.id = t.{e}_id\nWHERE t.{a} <> '';\n",
]
_JS = [
    "export function {a}{B}({c}, {d} = {n}) {{\n  return {c}.filter(({e}) => {e}.{d} > {d}).map(({e}) => {e}.{a});\n}}\n",
    "const {a} = await fetch(`/api/{b}/${{{c}}}`);\nif (!{a}.ok) throw new Error(`{b} failed: ${{{a}.status}}`);\n",
    "class {A}{B} {{\n  constructor({c}) {{\n    this.{c} = {c};\n  }}\n  {d}() {{\n    return this.{c}.length * {n};\n  }}\n}}\n",
    "for (const [{a}, {b}] of Object.entries({c})) {{\n  {d}[{a}] = ({d}[{a}] ?? 0) + {b};\n}}\n",
    "document.querySelectorAll('.{a}').forEach(({b}) => {b}.addEventListener('click', {c}));\n",
]
_CODE = {"python": (_PYTHON, "# "), "sql": (_SQL, "-- "), "js": (_JS, "// ")}

_SOURCES = {"en": ("wiki", "news", "forum"), "ru": ("wiki", "news", "forum"),
            "python": ("repo",), "sql": ("repo",), "js": ("repo",)}
# share of ordinary rows per language; lengths in words (log-uniform), long docs apart
_LANGS = (("en", 0.45), ("ru", 0.30), ("python", 0.10), ("sql", 0.075), ("js", 0.075))
_WORDS = (1, 600)
_LONG_WORDS = {"en": (16_000, 34_000), "ru": (8_000, 16_000)}   # ~20k-40k cl100k tokens
ROW_GROUP_ROWS = 2000   # several row groups in a big file, so readers can split it
DUPLICATE_SHARE = 0.03

EMOJI_CJK = ("今天天气很好，我们去公园散步吧！🌳🌞 東京は晴れです。서울은 맑아요. "
             "👍🏽 👨‍👩‍👧 🇷🇺 🏳️‍🌈 ∑∫√ café naïve")
SPECIAL_TOKENS = "<|endoftext|>" * 3 + "<|fim_prefix|><|fim_middle|><|fim_suffix|><|endofprompt|>"


class _Prose:
    """One long stream of sentences (4-20 words, a comma now and then, paragraphs of about
    five sentences) generated at once with numpy; documents take consecutive words from it,
    which keeps 20k documents within seconds."""

    def __init__(self, rng: np.random.Generator, vocab: np.ndarray, n_words: int):
        words = vocab[rng.integers(0, len(vocab), n_words)]
        seps = np.full(n_words, " ", dtype=object)
        seps[rng.random(n_words) < 0.06] = ", "
        ends = np.cumsum(rng.integers(4, 21, n_words // 4 + 2))
        ends = ends[ends < n_words] - 1
        seps[ends] = rng.choice(np.array([". ", ". ", ". ", "? ", "! "], dtype=object), len(ends))
        paragraphs = ends[rng.random(len(ends)) < 0.2]
        seps[paragraphs] = [sep.rstrip() + "\n\n" for sep in seps[paragraphs]]
        starts = np.concatenate([[0], ends + 1])
        starts = starts[starts < n_words]
        words[starts] = [w.capitalize() for w in words[starts]]
        self._pieces = (words + seps).tolist()
        self._pos = 0

    def take(self, n_words: int) -> str:
        """The next n_words as a text that starts with a capital and ends with a full stop."""
        pieces = self._pieces[self._pos:self._pos + n_words]
        self._pos += n_words
        pieces[0] = pieces[0][:1].upper() + pieces[0][1:]
        pieces[-1] = pieces[-1].rstrip(" ,.?!\n") + "."
        return "".join(pieces)


def _code(rng: np.random.Generator, comments: _Prose, lang: str, n_words: int) -> str:
    templates, comment = _CODE[lang]
    snippets = [comment + comments.take(int(rng.integers(4, 14))).replace("\n\n", " ") + "\n"]
    for _ in range(max(1, n_words // 25)):
        names = _IDENTS[rng.integers(0, len(_IDENTS), 6)]
        fields = dict(zip("abcdef", names, strict=True), A=names[0].capitalize(), B=names[1].capitalize(),
                      n=int(rng.integers(1, 1000)))
        snippets.append(templates[int(rng.integers(len(templates)))].format(**fields))
    return "\n".join(snippets)


def _log_uniform(rng: np.random.Generator, lo: int, hi: int) -> int:
    return int(np.exp(rng.uniform(np.log(lo), np.log(hi + 1))))


def write_sample_corpus(path: str, n_docs: int = 300, seed: int = 0, bad_rows: bool = True,
                        long_docs: int | None = None) -> dict[str, Any]:
    """Write n_docs rows to the Parquet file `path`; returns counts by kind. long_docs
    defaults to 1% of the rows (at least one)."""
    specials = 7 if bad_rows else 0      # the edge-case rows below (two share an id)
    long_docs = max(1, n_docs // 100) if long_docs is None else long_docs
    if n_docs < specials + long_docs + 1:
        raise ValueError(f"n_docs must be at least {specials + long_docs + 1} for these options")
    rng = np.random.default_rng(seed)
    langs, shares = [lang for lang, _ in _LANGS], [share for _, share in _LANGS]
    n_plain = n_docs - specials - long_docs
    n_duplicates = int(n_plain * DUPLICATE_SHARE)
    docs = [(str(lang), _log_uniform(rng, *_WORDS), "")
            for lang in rng.choice(langs, n_plain - n_duplicates, p=shares)]
    docs += [(str(lang), int(rng.integers(*_LONG_WORDS[lang])), "books")
             for lang in rng.choice(["en", "ru"], long_docs)]
    need = {"en": 12, "ru": 12}   # words of prose to generate; 12 for an edge row each
    for lang, n, _ in docs:
        if lang in _CODE:
            need["en"] += 13          # its comment line
        else:
            need[lang] += n
    prose = {"en": _Prose(rng, _EN, need["en"]), "ru": _Prose(rng, _RU, need["ru"])}
    rows: list[tuple[str | None, str, str]] = [   # (text, lang, source)
        (_code(rng, prose["en"], lang, n) if lang in _CODE else prose[lang].take(n), lang,
         source or str(rng.choice(_SOURCES[lang])))
        for lang, n, source in docs]
    for i in rng.integers(0, n_plain - n_duplicates, n_duplicates):
        text, lang, _ = rows[i]
        rows.append((text, lang, "mirror"))
    if bad_rows:
        rows += [(None, "en", "edge"), ("", "en", "edge"), (" \n\t \u3000", "en", "edge"),
                 (SPECIAL_TOKENS, "en", "edge"), (EMOJI_CJK, "mul", "edge"),
                 (prose["en"].take(12), "en", "edge"), (prose["ru"].take(12), "ru", "edge")]
    order = rng.permutation(len(rows))
    ids = [f"doc-{i:06d}" for i in range(len(rows))]
    if bad_rows:   # the last two rows (before shuffling) share an id
        ids[-1] = ids[-2]
    table = pa.table({
        "id": pa.array([ids[i] for i in order], pa.string()),
        "text": pa.array([rows[i][0] for i in order], pa.string()),
        "lang": pa.array([rows[i][1] for i in order], pa.string()),
        "source": pa.array([rows[i][2] for i in order], pa.string()),
    })
    pq.write_table(table, path, row_group_size=ROW_GROUP_ROWS)
    texts = [r[0] for r in rows if r[0]]
    # mirrored rows plus the short texts that coincide by chance ("Does.")
    counts = {"rows": len(rows), "long_docs": long_docs,
              "duplicate_texts": len(texts) - len(set(texts))}
    counts.update({f"lang_{lang}": sum(r[1] == lang for r in rows) for lang in (*langs, "mul")})
    if bad_rows:
        counts.update(null_text=1, empty_text=1, whitespace_text=1, duplicate_id_rows=2,
                      special_token_text=1, emoji_cjk_text=1)
    counts["expected_failed_rows"] = 5 if bad_rows else 0   # null, empty, blank, both duplicates
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.corpora.sample",
                                     description="Write the deterministic sample corpus.")
    parser.add_argument("out", help="Parquet file to write")
    parser.add_argument("--docs", type=int, default=300, help="rows (default 300)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--long-docs", type=int, default=None,
                        help="documents of several 8191-token chunks (default 1%% of rows)")
    parser.add_argument("--no-bad-rows", action="store_true",
                        help="leave out the null/empty/blank/duplicate-id/special-token rows")
    args = parser.parse_args(argv)
    try:
        counts = write_sample_corpus(args.out, n_docs=args.docs, seed=args.seed,
                                     bad_rows=not args.no_bad_rows, long_docs=args.long_docs)
    except (ValueError, OSError) as exc:
        print(f"sample_corpus: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
