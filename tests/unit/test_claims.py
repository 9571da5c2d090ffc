"""The claims of streaming dedupe: first row claims, open claims gather rows, sealed claims
turn later rows into late refs pointing at the first row; worker processes sharing a claim file
claim each text once between them; the directories of killed jobs' claim files are swept."""
from __future__ import annotations

import hashlib
import multiprocessing
import os
import threading
import time

from transforms.dedupe.claimfile import ClaimFile, claim_dir, sweep_stale
from transforms.dedupe.distinct import Claims, LateRef
from transforms.records import ChunkRef, TextItem
from transforms.worker import runscoped


def ref(doc: str, index: int = 0, start: int = 0) -> ChunkRef:
    return ChunkRef(doc, index, 1, start, start + 5, 5, ())


SHA = hashlib.sha256(b"text").hexdigest()


def test_rows_join_an_open_claim_and_late_rows_point_at_the_first():
    claims = Claims()
    assert claims.add(SHA, ref("b", 1, 10)) is True
    assert claims.add(SHA, ref("a", 2, 20)) is False
    sealed = claims.seal(TextItem(SHA, "text", 5, (ref("b", 1, 10),)))
    assert sealed.refs == (ref("a", 2, 20), ref("b", 1, 10))  # sorted: the first row is the smallest
    assert claims.add(SHA, ref("c")) is False
    assert claims.late == [LateRef(ref("c"), SHA, ("a", 2, 20, 25))]


def test_an_item_not_claimed_here_is_left_alone():
    item = TextItem(SHA, "text", 5, (ref("x"),))
    assert Claims().seal(item) is item


def test_one_claim_per_text_under_threads():
    claims, firsts = Claims(), []
    lock = threading.Lock()

    def worker(n):
        for i in range(200):
            if claims.add(hashlib.sha256(str(i).encode()).hexdigest(), ref(f"{n}-{i}")):
                with lock:
                    firsts.append(i)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(firsts) == list(range(200))


def test_runs_are_kept_apart_and_discarded():
    a = Claims.for_run("run-a")
    assert Claims.for_run("run-a") is a and Claims.for_run("run-b") is not a
    runscoped.discard("run-a")
    assert runscoped.get("run-a", "claims") is None and runscoped.get("run-b", "claims") is not None
    runscoped.discard("run-b")


def test_a_runs_claims_are_built_once():
    """Every sealed request asks for the run's claims: building one each time (2 MB of bitmap)
    cost 0.7 s of CPU on 20,000 documents."""
    built = []

    class Counting(Claims):
        def __init__(self, shared=None):
            built.append(1)
            super().__init__(shared)

    assert Counting.for_run("run-c") is Counting.for_run("run-c")
    assert len(built) == 1
    runscoped.discard("run-c")


def test_another_processs_claim_makes_a_row_late_and_the_file_keeps_it(tmp_path):
    shared = ClaimFile.create(str(tmp_path / "claims.sqlite"))
    mine, theirs = Claims(shared), Claims(ClaimFile(shared.path))   # two processes' claims
    assert mine.add(SHA, ref("b", 1, 10)) is True
    assert theirs.add(SHA, ref("a", 2, 20)) is False   # open elsewhere: it cannot join, so it is late
    assert mine.add(SHA, ref("c", 3, 30)) is False     # open here: it joins
    assert mine.seal(TextItem(SHA, "text", 5, (ref("b", 1, 10),))).refs == (ref("b", 1, 10), ref("c", 3, 30))
    assert theirs.add(SHA, ref("d")) is False
    # the claiming row has the outcome every row of the claim shares
    assert shared.late() == [LateRef(ref("a", 2, 20), SHA, ("b", 1, 10, 15)), LateRef(ref("d"), SHA, ("b", 1, 10, 15))]
    assert mine.late == theirs.late == []   # the driver reads the file, not a worker's memory


def _claim(path: str, worker: int, order: list[int], start, results) -> None:
    claims = Claims(ClaimFile(path))

    def won(i: int) -> bool:
        return claims.add(hashlib.sha256(str(i).encode()).hexdigest(), ref(f"{worker}-{i}"))

    start.wait()
    first = [order[0]] if won(order[0]) else []
    start.wait()   # every process holds a claim: the rest races (one process alone took all 300
    #                texts before the others woke, on a loaded machine)
    results.put((worker, first + [i for i in order[1:] if won(i)]))


def test_processes_sharing_a_claim_file_send_each_text_once(tmp_path):
    shared = ClaimFile.create(str(tmp_path / "claims.sqlite"))
    n = 300
    orders = [list(range(n)), list(reversed(range(n))), list(range(n // 2, n)) + list(range(n // 2))]
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Barrier(len(orders)), ctx.Queue()
    workers = [ctx.Process(target=_claim, args=(shared.path, w, order, start, results)) for w, order in enumerate(orders)]
    for w in workers:
        w.start()
    firsts = dict(results.get(timeout=60) for _ in workers)
    for w in workers:
        w.join(timeout=60)
    claimed = [i for w in sorted(firsts) for i in firsts[w]]
    assert sorted(claimed) == list(range(n))   # each text once, by one of them
    assert all(firsts.values()), firsts   # each won the text it tried first
    late = shared.late()
    assert len(late) == n * (len(orders) - 1)
    # each late row points at the one row that claimed its text
    claimer = {i: w for w, mine in firsts.items() for i in mine}
    for row in late:
        i = int(row.ref.doc_id.split("-")[1])
        assert row.first[0] == f"{claimer[i]}-{i}" != row.ref.doc_id


def _killed(path: str) -> None:
    """A job that made its claim directory and died (its lock went with it)."""
    with claim_dir(path) as made:
        os.rename(made, made + "-killed")   # what rmtree would have removed, kept as a kill leaves it


def test_the_claim_directories_of_killed_jobs_are_swept_and_live_ones_kept(tmp_path):
    parent = str(tmp_path)
    _killed(parent)
    (stale,) = [p for p in os.listdir(parent)]
    with claim_dir(parent) as live:                      # a job running now: its lock is held
        assert os.path.exists(live) and not os.path.exists(os.path.join(parent, stale))
        assert sweep_stale(parent) == []                 # another job's sweep leaves it
        young = tmp_path / "embedpipe-claims-young"      # being made: no lock file yet
        old = tmp_path / "embedpipe-claims-old"          # torn before its lock file
        young.mkdir(), old.mkdir()
        os.utime(old, (time.time() - 3600,) * 2)
        (tmp_path / "unrelated").mkdir()
        assert sweep_stale(parent) == [str(old)]
        assert sorted(os.listdir(parent)) == sorted([os.path.basename(live), "embedpipe-claims-young", "unrelated"])
    assert not os.path.exists(live)                      # a job's own directory goes with it
