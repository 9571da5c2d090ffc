"""The local runner's worker processes pull the input's row groups from one pool
(transforms/read/parquet.py's `pulled`, over the claim file): each row group is read once, and
the puller that comes back for more sooner reads more of them."""
from __future__ import annotations

import itertools

import pyarrow as pa
import pyarrow.parquet as pq

from transforms.dedupe.claimfile import ClaimFile
from transforms.read.parquet import pulled

GROUPS, GROUP_ROWS = 6, 100   # a row group under BATCH_ROWS is one table


def corpus(tmp_path) -> list[tuple[str, dict]]:
    entries = []
    for f in range(2):
        path = tmp_path / f"part-{f}.parquet"
        ids = [f"f{f}-{i}" for i in range(GROUPS * GROUP_ROWS)]
        pq.write_table(pa.table({"id": ids, "text": [f"text of {i}" for i in ids]}), path, row_group_size=GROUP_ROWS)
        entries.append((str(path), {}))
    return entries


def ids(tables) -> list[str]:
    return [i for t in tables for i in t.column("id").to_pylist()]


def test_the_puller_that_comes_back_sooner_reads_more_and_every_row_is_read_once(tmp_path):
    entries = corpus(tmp_path)
    path = str(tmp_path / "claims.sqlite")
    ClaimFile.create(path)
    # two processes' connections; the fast one asks for its next table three times as often
    fast = pulled(0, entries, ClaimFile(path), ["id", "text"])
    slow = pulled(1, entries, ClaimFile(path), ["id", "text"])
    read = {"fast": [], "slow": []}
    for name, puller in itertools.cycle([("fast", fast)] * 3 + [("slow", slow)]):
        table = next(puller, None)
        if table is None:
            break
        read[name].append(table)
    read["fast"] += list(fast)
    read["slow"] += list(slow)
    assert sorted(ids(read["fast"] + read["slow"])) == sorted(f"f{f}-{i}" for f in range(2)
                                                               for i in range(GROUPS * GROUP_ROWS))
    assert len(read["fast"]) >= 2 * len(read["slow"]) > 0, {k: len(v) for k, v in read.items()}


def test_a_puller_alone_reads_everything_and_a_second_pool_starts_afresh(tmp_path):
    entries = corpus(tmp_path)
    first, second = (ClaimFile.create(str(tmp_path / name)) for name in ("a.sqlite", "b.sqlite"))
    assert len(ids(pulled(0, entries, first, ["id"]))) == 2 * GROUPS * GROUP_ROWS
    assert ids(pulled(1, entries, first, ["id"])) == []   # the pool is empty
    assert len(ids(pulled(0, entries, second, ["id"]))) == 2 * GROUPS * GROUP_ROWS
