"""Never paying twice across runs: a job killed with SIGKILL resumes from its journal, `--known`
reuses another directory's vectors, and a directory of another model is refused."""
from __future__ import annotations

import hashlib
import io
import json
import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from pipeline.cli import main
from tests.conftest import SANDBOX_KEY
from tests.e2e.money_helpers import (MODEL, assert_every_row_once, billed_twice, corpus_rows, current, journal_files,
                                     kill_once_journaled, ledger, micro, run, start_sandbox, summary, write_corpus,
                                     write_models)

# A request waits this long in the sandbox before it is charged: killing the job (and the
# sandbox) right after a journal entry appears catches the next request before its charge.
LATENCY_MS = 300
JOURNALED_BEFORE_KILL = 3


# Resumes stream on the local runner (transforms/dedupe/known.py: indexes in the process), its
# worker processes sharing a claim file when there are several; --doc-vectors groups by text hash
# instead, across processes here as the distributed runners do across workers. Every way must pay
# for nothing twice.
PROCESSES = ("--direct_num_workers", "2", "--direct_running_mode", "multi_processing")
WAYS = {"streaming": (), "processes": PROCESSES, "grouping": ("--doc_vectors", *PROCESSES)}
# the worker processes without grouping in make soak: grouping runs them too
WAY_PARAMS = [pytest.param(w, marks=pytest.mark.soak) if w == "processes" else w for w in WAYS]


@pytest.fixture
def env_key(monkeypatch):
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)


def read_journal(out: Path) -> dict[str, tuple[dict, dict[str, int]]]:
    """request_id -> (request row, {text_sha256: share_micro})"""
    entries = {}
    for path in journal_files(out):
        table = pq.read_table(io.BytesIO(path.read_bytes()))
        request = json.loads(table.schema.metadata[b"request"])
        shares = dict(zip(table.column("text_sha256").to_pylist(), table.column("share_micro").to_pylist(), strict=True))
        entries[request["request_id"]] = (request, shares)
    return entries


def kill_midway(tmp_path: Path, sandbox_factory, rows: list[dict]) -> tuple[Path, Path, Path, object]:
    """Start the job on ROWS, SIGKILL it once a few answers are journaled. (corpus, models, out,
    the stopped sandbox whose db holds the ledger)."""
    corpus, models = write_corpus(tmp_path / "corpus.parquet", rows), write_models(tmp_path / "models.yaml")
    slow = start_sandbox(sandbox_factory, models, args=["--latency-ms", str(LATENCY_MS)])
    out = tmp_path / "out"
    kill_once_journaled(corpus, out, slow, models, tmp_path / "job.log", JOURNALED_BEFORE_KILL)
    return corpus, models, out, slow


@pytest.mark.parametrize("way", WAY_PARAMS)
def test_killed_run_resumes_without_paying_twice(tmp_path, sandbox_factory, env_key, way):
    rows = corpus_rows(n_short=120, n_long=2)
    corpus, models, out, slow = kill_midway(tmp_path, sandbox_factory, rows)
    journal = read_journal(out)
    before = ledger(slow)
    assert len(journal) >= JOURNALED_BEFORE_KILL
    assert {c["request_id"] for c in before} == set(journal), "a charge the job never saw"
    assert not list(out.glob("history/*/embeddings-*.parquet")), "killed before any output was written"

    sb = start_sandbox(sandbox_factory, models, db=slow.db)     # same ledger and balance, no latency
    assert run(corpus, out, sb, models, "--resume", *WAYS[way]) == 0
    charges = ledger(sb)
    assert len(charges) > len(before)
    assert billed_twice(charges) == {}
    kinds = assert_every_row_once(out, rows)
    assert kinds["pending"] == 0

    # the journaled rows are in embeddings with their original request ids and cost shares
    emb = current(out, "embeddings").to_pylist()
    cost_by_request = {c["request_id"]: c["cost_rub"] for c in charges}
    for request_id, (request, shares) in journal.items():
        assert request["cost_rub"] == cost_by_request[request_id]
        for sha, share in shares.items():
            rows_of_text = [r for r in emb if r["text_sha256"] == sha]
            assert rows_of_text and {r["request_id"] for r in rows_of_text} == {request_id}
            assert micro(r["cost_rub"] for r in rows_of_text) == share
    requests = current(out, "requests")
    assert sorted(requests.column("request_id").to_pylist()) == sorted(cost_by_request)
    assert micro(requests.column("cost_rub").to_pylist()) == micro(cost_by_request.values())
    # what the killed run paid is carried over, not counted against this run's balance delta
    recon = summary(out)["reconciliation"]
    assert round(recon["carried_over_from_journal_rub"] * 1e6) == micro(r["cost_rub"] for r, _ in journal.values())
    assert recon["balance_minus_requests_rub"] == 0 and recon["rows_minus_requests_rub"] == 0



@pytest.mark.parametrize("way", WAY_PARAMS)
def test_known_vectors_are_reused_at_no_cost_and_another_model_is_refused(tmp_path, sandbox_factory, env_key, way):
    first_rows = corpus_rows(n_short=60, n_long=1, prefix="a-")
    models = write_models(tmp_path / "models.yaml")
    sb = start_sandbox(sandbox_factory, models)
    first = tmp_path / "first"
    assert run(write_corpus(tmp_path / "a.parquet", first_rows), first, sb, models) == 0
    paid = ledger(sb)
    old = {r["text_sha256"]: r for r in current(first, "embeddings").to_pylist()}

    # half of the earlier texts under new ids, plus new texts
    rows = [{"id": f"b-{i}", "text": r["text"]} for i, r in enumerate(first_rows[:30])]
    rows += corpus_rows(n_short=20, n_long=0, seed=11, prefix="new-")[:20]
    second = tmp_path / "second"
    assert run(write_corpus(tmp_path / "b.parquet", rows), second, sb, models,
               "--known", str(first / "current" / "embeddings-*.parquet"), *WAYS[way]) == 0
    charges = ledger(sb)
    new_charges = charges[len(paid):]
    assert new_charges, "the new texts were sent"
    assert not {h for c in new_charges for h in c["input_sha256"]} & set(old), "a known text was billed again"
    assert billed_twice(charges) == {}
    emb = current(second, "embeddings").to_pylist()
    reused = [r for r in emb if r["text_sha256"] in old]
    assert {r["doc_id"] for r in reused} == {f"b-{i}" for i in range(30)}
    for r in reused:
        assert r["cost_rub"] == 0
        assert r["request_id"] == old[r["text_sha256"]]["request_id"]
        np.testing.assert_array_equal(r["embedding"], old[r["text_sha256"]]["embedding"])
    assert_every_row_once(second, rows)

    # --resume into a directory that holds another model's vectors: exit 2 before spending
    assert run(write_corpus(tmp_path / "b.parquet", rows), first, sb, models, "--resume",
               "--model", "text-embedding-3-large") == 2
    assert ledger(sb) == charges


def test_later_resumes_count_each_journaled_request_once(tmp_path, sandbox_factory, env_key):
    """Resume first with part of the input (say one shard), then with all of it: the journaled
    texts left out of the first part are not paid again, and every request is in the current
    requests files exactly once, so rows, requests and ledger sum alike."""
    rows = corpus_rows(n_short=120, n_long=2)
    corpus, models, out, slow = kill_midway(tmp_path, sandbox_factory, rows)
    left_out = set(next(iter(read_journal(out).values()))[1])     # the texts of one journaled request
    part = [r for r in rows if hashlib.sha256(r["text"].encode()).hexdigest() not in left_out]
    assert len(part) < len(rows)
    sb = start_sandbox(sandbox_factory, models, db=slow.db)
    assert run(write_corpus(tmp_path / "part.parquet", part), out, sb, models, "--resume") == 0
    assert run(corpus, out, sb, models, "--resume") == 0
    charges = ledger(sb)
    assert billed_twice(charges) == {}
    assert_every_row_once(out, rows)
    requests = current(out, "requests")
    assert sorted(requests.column("request_id").to_pylist()) == sorted(c["request_id"] for c in charges)
    assert micro(current(out, "embeddings").column("cost_rub").to_pylist()) \
        == micro(requests.column("cost_rub").to_pylist()) == micro(c["cost_rub"] for c in charges)


def test_running_again_into_a_finished_directory_does_not_pay_twice(tmp_path, sandbox_factory, env_key):
    """The same command run twice (a retry after success, a scheduler re-run): either refused
    before spending (exit 2) or nothing billed again; never two copies in the current files."""
    rows = corpus_rows(n_short=40, n_long=1)
    corpus, models = write_corpus(tmp_path / "corpus.parquet", rows), write_models(tmp_path / "models.yaml")
    sb = start_sandbox(sandbox_factory, models)
    out = tmp_path / "out"
    assert run(corpus, out, sb, models) == 0
    paid = ledger(sb)
    code = run(corpus, out, sb, models)
    charges = ledger(sb)
    print(f"\nsecond plain run: exit {code}, {len(charges) - len(paid)} more charges, "
          f"{len(billed_twice(charges))} texts billed twice")
    assert code in (0, 2)
    assert billed_twice(charges) == {}
    assert_every_row_once(out, rows)


@pytest.mark.parametrize("way", WAY_PARAMS)
def test_resume_knows_chunks_the_service_made_us_split(tmp_path, sandbox_factory, env_key, way):
    """The service counts 30% more tokens than the client: long chunks come back over-length and
    are re-split and paid as pieces. A later --resume must know them as delivered."""
    rows = corpus_rows(n_short=20, n_long=2)
    corpus, models = write_corpus(tmp_path / "corpus.parquet", rows), write_models(tmp_path / "models.yaml")
    sb = start_sandbox(sandbox_factory, models, args=["--token-skew", f"{MODEL}=1.3"])
    out = tmp_path / "out"
    assert run(corpus, out, sb, models) == 0
    paid = ledger(sb)
    emb = current(out, "embeddings")
    assert emb.num_rows > sum(1 for r in rows if r["text"])        # some chunks arrived in pieces
    assert run(corpus, out, sb, models, "--resume", *WAYS[way]) == 0
    print(f"\nresume after re-split: {len(ledger(sb)) - len(paid)} more charges")
    assert ledger(sb) == paid
    assert_every_row_once(out, rows)


def test_resume_under_other_chunks_is_refused_before_paying(tmp_path, sandbox_factory, env_key, caplog):
    """A journal's answers are found by their chunks' text: a --resume that cuts otherwise would
    find none and pay for all again. Refused before any request, naming the journal's chunking;
    the command it names resumes the journal with nothing paid twice."""
    rows = corpus_rows(n_short=120, n_long=2)
    corpus, models, out, slow = kill_midway(tmp_path, sandbox_factory, rows)
    sb = start_sandbox(sandbox_factory, models, db=slow.db)
    before = ledger(sb)
    caplog.clear()
    assert run(corpus, out, sb, models, "--resume", "--chunk-tokens", "16") == 2
    assert ledger(sb) == before
    err = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(err) == 1 and "interrupted run" in err[0], err
    flags = re.search(r"pass (--chunk-tokens \d+ --overlap-tokens \d+) to resume it", err[0])
    assert flags and "this run cuts 16-token chunks (--chunk-tokens 16)" in err[0], err
    # plan refuses as the run does
    assert main(["plan", "--input", str(corpus), "--output", str(out), "--model", MODEL, "--base-url", sb.base_url,
                 "--models-config", str(models), "--resume", "--chunk-tokens", "16"]) == 2
    assert run(corpus, out, sb, models, "--resume", *flags[1].split()) == 0
    assert billed_twice(ledger(sb)) == {}
    assert summary(out)["reconciliation"]["carried_over_from_journal_rub"] > 0
    assert_every_row_once(out, rows)


def test_journaled_answers_no_input_has_are_named_as_such(tmp_path, sandbox_factory, env_key):
    """Documents edited between the kill and the --resume: what the killed run paid for their
    old texts reaches no row. The reconciliation says so, not that answers were dead-lettered."""
    rows = corpus_rows(n_short=120, n_long=2)
    corpus, models, out, slow = kill_midway(tmp_path, sandbox_factory, rows)
    journaled = {sha for _, shares in read_journal(out).values() for sha in shares}
    edited = [{**r, "text": f"{r['text']} edited"} if r["text"] and
              hashlib.sha256(r["text"].encode()).hexdigest() in journaled else r for r in rows]
    sb = start_sandbox(sandbox_factory, models, db=slow.db)
    assert run(write_corpus(tmp_path / "edited.parquet", edited), out, sb, models, "--resume") == 0
    notes = summary(out)["reconciliation"]["notes"]
    assert any("journaled by a killed run for texts no later input had" in n for n in notes), notes
    assert not any("dead-lettered" in n for n in notes), notes


def test_a_killed_switch_to_other_chunks_is_resumed_by_the_switch_the_refusal_names(tmp_path, sandbox_factory,
                                                                                    env_key, caplog):
    """Killed while building a switch's view of other chunks: a plain --sync under the view's
    chunks would pay for those answers again. Refused, naming the switch that resumes them."""
    rows = corpus_rows(n_short=120, n_long=2)
    corpus, models = write_corpus(tmp_path / "corpus.parquet", rows), write_models(tmp_path / "models.yaml")
    out = tmp_path / "out"
    slow = start_sandbox(sandbox_factory, models, args=["--latency-ms", str(LATENCY_MS)])
    assert run(corpus, out, start_sandbox(sandbox_factory, models, db=slow.db), models) == 0
    kill_once_journaled(corpus, out, slow, models, tmp_path / "job.log", JOURNALED_BEFORE_KILL,
                        "--sync", "--switch-model", "--chunk-tokens", "64")
    sb = start_sandbox(sandbox_factory, models, db=slow.db)
    before = ledger(sb)
    caplog.clear()
    assert run(corpus, out, sb, models, "--sync") == 2
    assert ledger(sb) == before
    err = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    flags = re.search(r"pass (--sync --switch-model --chunk-tokens 64 --overlap-tokens 0) to resume the switch", err[0])
    assert len(err) == 1 and flags, err
    assert run(corpus, out, sb, models, *flags[1].split()) == 0
    assert billed_twice(ledger(sb)) == {}
    assert_every_row_once(out, rows)
