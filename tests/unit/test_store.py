"""The store of paid texts (transforms/dedupe/store.py) on a local directory: what one process
puts it finds at once, another finds after a refresh, compaction keeps every text findable
(by a reader whose index predates it too, or whose listing it runs in the middle of), and a
CLI output DIR is refused for writing and for compaction."""
from __future__ import annotations

import datetime as dt
import hashlib
import shutil
import subprocess
from collections.abc import Callable

import numpy as np
import pytest
from apache_beam.io.filesystems import FileSystems

from embedpipe.compact import main as compact_main
from embedpipe.store import compact_store
from transforms.dedupe.compaction import compact
from transforms.dedupe.store import PaidStore, StoreError, StoreSpec, spec
from transforms.money import journal

MODEL, DIMS = "text-embedding-3-small", 8


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _put(store: PaidStore, run_id: str, request_id: str, texts: list[str]) -> np.ndarray:
    vectors = np.random.default_rng(len(request_id)).random((len(texts), DIMS), dtype=np.float32)
    row = {"request_id": request_id, "model": MODEL, "n_inputs": len(texts), "prompt_tokens": 3, "total_tokens": 3,
           "cost_rub": 0.1, "balance_after": 1.0, "attempts": 1, "latency_ms": 5, "status": 200,
           "started_at": dt.datetime.now(dt.UTC), "run_id": run_id}
    store.put(row, [_sha(t) for t in texts], [3] * len(texts), vectors, [1] * len(texts))
    return vectors


def test_put_lookup_refresh_and_compaction(tmp_path):
    where = StoreSpec(str(tmp_path / "store"))
    one, other = PaidStore(where, MODEL, DIMS), PaidStore(where, MODEL, DIMS)
    a = _put(one, "run1", "r1", ["alpha", "beta"])
    found = one.lookup([_sha("alpha"), _sha("beta"), _sha("gamma")])
    assert set(found) == {_sha("alpha"), _sha("beta")} and found[_sha("alpha")][1:] == ("r1", 3)
    assert np.array_equal(found[_sha("beta")].vector, a[1])
    assert other.lookup([_sha("alpha")]) == {}            # another process: not until it lists again
    other.refresh()
    assert np.array_equal(other.lookup([_sha("alpha")])[_sha("alpha")].vector, a[0])
    assert PaidStore(where, MODEL, DIMS + 1).lookup([_sha("alpha")]) == {}   # another length: never
    g = _put(other, "run2", "r2", ["gamma", "alpha"])   # alpha paid twice: the first place wins
    stale = PaidStore(where, MODEL, DIMS)
    done = compact(where.path)
    assert (done.entries, done.written, done.texts) == (2, 1, 3)
    assert not list((tmp_path / "store" / "_journal").glob("*/*.parquet"))
    # STALE's index points at entries now gone: it lists again and finds the compacted file
    found = stale.lookup([_sha("alpha"), _sha("gamma")])
    assert np.array_equal(found[_sha("alpha")].vector, a[0]) and np.array_equal(found[_sha("gamma")].vector, g[0])
    fresh = PaidStore(where, MODEL, DIMS)
    assert fresh.size == 3 and np.array_equal(fresh.lookup([_sha("beta")])[_sha("beta")].vector, a[1])
    _put(fresh, "run3", "r3", ["delta"])
    assert compact(where.path).texts == 4 and PaidStore(where, MODEL, DIMS).size == 4


def test_a_cli_output_dir_is_read_only(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "_current.json").write_text("{}")
    with pytest.raises(StoreError, match="read_stores="):
        spec(str(tmp_path / "out"))
    assert spec(str(tmp_path / "s"), [str(tmp_path / "out")]).locations == (str(tmp_path / "s"), str(tmp_path / "out"))


def test_a_worker_lists_the_store_again_when_its_listing_is_due(tmp_path):
    writer = PaidStore(StoreSpec(str(tmp_path / "s")), MODEL, DIMS)
    eager = PaidStore(StoreSpec(str(tmp_path / "s"), refresh_s=0.0), MODEL, DIMS)
    lazy = PaidStore(StoreSpec(str(tmp_path / "s"), refresh_s=3600.0), MODEL, DIMS)
    _put(writer, "run1", "r1", ["alpha"])
    assert eager.holds(_sha("alpha")) and not lazy.holds(_sha("alpha"))


@pytest.mark.parametrize("after_match", [1, 2])
def test_a_compaction_between_the_steps_of_a_listing_loses_no_text(tmp_path, monkeypatch, after_match):
    """A compaction renames its merged file in and deletes the entries right after the
    listing's first match (between its two steps), or after both (before the files are read):
    the reader still finds every text, so none of them is paid again."""
    where = StoreSpec(str(tmp_path / "store"), refresh_s=3600.0)
    writer = PaidStore(where, MODEL, DIMS)
    vectors = _put(writer, "run1", "r1", ["alpha", "beta"])
    matches, real_match = [], FileSystems.match

    def match(patterns, *args, **kwargs):
        result = real_match(patterns, *args, **kwargs)
        matches.append(patterns)
        if len(matches) == after_match:
            assert compact(where.path).entries == 1
        return result
    monkeypatch.setattr(FileSystems, "match", match)
    reader = PaidStore(where, MODEL, DIMS)
    monkeypatch.setattr(FileSystems, "match", real_match)
    assert reader.holds(_sha("alpha")) and reader.holds(_sha("beta"))
    assert np.array_equal(reader.lookup([_sha("beta")])[_sha("beta")].vector, vectors[1])


def _cli_dir(root) -> str:
    """An output DIR of the CLI whose first run was killed after paying: its start record, its
    lock and a journal entry with its intent (the CLI's own layout, pipeline/outdir/layout.py)."""
    out = root / "out"
    (out / "_runs").mkdir(parents=True)
    (out / "_runs" / "run1.json").write_text("{}")
    (out / "_lock.json").write_text("{}")
    _put(PaidStore(StoreSpec(str(out)), MODEL, DIMS), "run1", "r1", ["alpha"])
    journal.write_intent(str(out), "run1", "r1", 3, 10)
    return str(out)


def _tree(root) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("marker", ["_runs", "_current.json"])
def test_compaction_refuses_a_cli_output_dir_and_touches_nothing(tmp_path, marker, capsys):
    out = _cli_dir(tmp_path)
    if marker == "_current.json":   # one that committed a view, its start records gone
        shutil.rmtree(f"{out}/_runs")
        (tmp_path / "out" / "_current.json").write_text("{}")
    before = _tree(tmp_path / "out")
    with pytest.raises(StoreError, match="output DIR of the CLI"):
        compact(out)
    with pytest.raises(StoreError):
        compact_store(out)
    assert compact_main([out]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "output DIR of the CLI" in err and "nothing was changed" in err
    assert _tree(tmp_path / "out") == before


@pytest.mark.parametrize("location", ["stores/day[1]", "stores/*", "stores/day?"])
def test_a_location_read_as_a_pattern_is_refused(tmp_path, location):
    """Beam lists `day[1]/...` as `day1/...`: another store's texts, or none, and never its own."""
    where = str(tmp_path / location)
    for call in (lambda: spec(where), lambda: spec(str(tmp_path / "store"), [where]), lambda: compact(where)):
        with pytest.raises(StoreError, match=r"read as a pattern"):
            call()


@pytest.fixture
def read_only_folder():
    """Call with a folder: it becomes a tmpfs of its own (root may mount one), made read-only by
    calling what is returned once its files are written. Unmounted at teardown."""
    mounts = []

    def make(folder) -> Callable[[], None]:
        folder.mkdir(parents=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)], capture_output=True,
                              text=True)
        if done.returncode:
            pytest.skip(f"a tmpfs cannot be mounted here ({done.stderr.strip() or done.returncode})")
        mounts.append(folder)
        return lambda: subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)

    yield make
    for folder in mounts:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def test_a_compaction_that_cannot_remove_some_merged_entries_removes_the_others_and_says_so(
        tmp_path, read_only_folder, capsys):
    """One run's entries sit on a read-only filesystem: every other merged entry goes, the texts
    stay findable, and the command says so in one line (exit 2), no traceback."""
    root = tmp_path / "store"
    freeze = read_only_folder(root / "_journal" / "run2")
    one = PaidStore(StoreSpec(str(root)), MODEL, DIMS)
    for run_id, texts in (("run1", ["alpha"]), ("run2", ["beta"]), ("run3", ["gamma"])):
        _put(one, run_id, f"r-{run_id}", texts)
    freeze()
    assert compact_main([str(root)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "of the files merged could not be removed" in err, err
    assert [p.parent.name for p in root.glob("_journal/*/*.parquet")] == ["run2"]
    assert PaidStore(StoreSpec(str(root)), MODEL, DIMS).size == 3
