"""The local runner's worker processes pull the input from one pool (transforms/read/parquet.py's
`pulled`, over the claim file): every row is read once, the puller that comes back for more
sooner reads more, a row group still being read is shared at the end, and one of one file too."""
from __future__ import annotations

import itertools

import pyarrow as pa
import pyarrow.parquet as pq

from transforms.dedupe.claimfile import ClaimFile
from transforms.read import parquet
from transforms.read.parquet import BATCH_ROWS, pulled

GROUPS, GROUP_ROWS = 6, 100   # a row group under BATCH_ROWS is one table


def corpus(tmp_path, files: int = 2, rows: int = GROUPS * GROUP_ROWS, group_rows: int = GROUP_ROWS):
    entries = []
    for f in range(files):
        path = tmp_path / f"part-{f}.parquet"
        ids = [f"f{f}-{i}" for i in range(rows)]
        pq.write_table(pa.table({"id": ids, "text": [f"text of {i}" for i in ids]}), path, row_group_size=group_rows)
        entries.append((str(path), {}))
    return entries


def pool(tmp_path) -> str:
    path = str(tmp_path / "claims.sqlite")
    ClaimFile.create(path)
    return path


def take_turns(pullers: dict, turns: list[str]) -> dict[str, list]:
    """Each puller's tables, asking them in TURNS (repeated) until one is done, then the rest."""
    read = {name: [] for name in pullers}
    for name in itertools.cycle(turns):
        table = next(pullers[name], None)
        if table is None:
            break
        read[name].append(table)
    for name, puller in pullers.items():
        read[name] += list(puller)
    return read


def ids(tables) -> list[str]:
    return [i for t in tables for i in t.column("id").to_pylist()]


def test_the_puller_that_comes_back_sooner_reads_more_and_every_row_is_read_once(tmp_path):
    entries, path = corpus(tmp_path), pool(tmp_path)
    # two processes' connections; the fast one asks for its next table three times as often
    read = take_turns({name: pulled(0, entries, ClaimFile(path), ["id", "text"]) for name in ("fast", "slow")},
                      ["fast"] * 3 + ["slow"])
    assert sorted(ids(read["fast"] + read["slow"])) == sorted(f"f{f}-{i}" for f in range(2)
                                                               for i in range(GROUPS * GROUP_ROWS))
    assert len(read["fast"]) >= 2 * len(read["slow"]) > 0, {k: len(v) for k, v in read.items()}


def test_a_file_of_one_row_group_is_shared_table_by_table(tmp_path):
    rows = 10 * BATCH_ROWS
    entries, path = corpus(tmp_path, files=1, rows=rows, group_rows=rows), pool(tmp_path)
    read = take_turns({name: pulled(0, entries, ClaimFile(path), ["id"]) for name in "ab"}, ["a", "b"])
    assert sorted(ids(read["a"] + read["b"])) == sorted(f"f0-{i}" for i in range(rows))
    assert min(len(read["a"]), len(read["b"])) >= 4, {k: len(v) for k, v in read.items()}


def test_a_puller_with_no_row_group_left_joins_the_one_started_last(tmp_path):
    group = 4 * BATCH_ROWS
    entries, path = corpus(tmp_path, files=1, rows=3 * group, group_rows=group), pool(tmp_path)
    a, b, c = (pulled(0, entries, ClaimFile(path), ["id"]) for _ in range(3))
    read = {"a": [next(a)], "b": [next(b)]}             # row groups 0 and 1, a table each
    read["c"] = [next(c) for _ in range(5)]             # row group 2 whole, then one of row group 1's
    assert ids(read["c"][4:]) == [f"f0-{i}" for i in range(group + BATCH_ROWS, group + 2 * BATCH_ROWS)]
    for name, puller in (("a", a), ("b", b), ("c", c)):
        read[name] += list(puller)
    assert sorted(ids(read["a"] + read["b"] + read["c"])) == sorted(f"f0-{i}" for i in range(3 * group))


def test_a_puller_alone_reads_everything_and_then_no_row_group_again(tmp_path, monkeypatch):
    entries = corpus(tmp_path)
    first, second = (ClaimFile.create(str(tmp_path / name)) for name in ("a.sqlite", "b.sqlite"))
    assert len(ids(pulled(0, entries, first, ["id"]))) == 2 * GROUPS * GROUP_ROWS
    opened = []
    read_row_group = parquet.read_row_group
    monkeypatch.setattr(parquet, "read_row_group", lambda *args: opened.append(args[0]) or read_row_group(*args))
    assert ids(pulled(1, entries, first, ["id"])) == [] and opened == []   # all read: none decoded again
    assert len(ids(pulled(0, entries, second, ["id"]))) == 2 * GROUPS * GROUP_ROWS
