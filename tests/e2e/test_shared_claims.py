"""Several local worker processes stream as one does, and share their claims through a file: a
text whose rows reach both is paid once, every row gets its vector (or its pending place), and
the file goes with the job."""
from __future__ import annotations

import collections
import os
import tempfile

import pyarrow.parquet as pq
import pytest

from tests.conftest import SANDBOX_KEY
from tests.e2e.helpers import current_files
from tests.e2e.money_helpers import (assert_every_row_once, billed_twice, corpus_rows, current, ledger, run,
                                     start_sandbox, write_corpus, write_models)

FILES = 6
PROCESSES = ("--direct_num_workers", "2", "--direct_running_mode", "multi_processing")


@pytest.fixture
def claim_dirs(monkeypatch) -> list[str]:
    """The temporary directories the driver makes while the test runs."""
    made, mkdtemp = [], tempfile.mkdtemp

    def recorded(*args, **kwargs):
        made.append(mkdtemp(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(tempfile, "mkdtemp", recorded)
    return made


@pytest.fixture
def setup(tmp_path, sandbox_factory, monkeypatch):
    """FILES files, each with texts of its own and the same few texts under other ids."""
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
    models = write_models(tmp_path / "models.yaml")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    common = [r["text"] for r in corpus_rows(n_short=6, n_long=1, seed=5)[:7]]
    rows = []
    for f in range(FILES):
        part = corpus_rows(n_short=30, n_long=0, seed=10 + f, prefix=f"f{f}-")[:30]
        part += [{"id": f"f{f}-common-{i}", "text": text} for i, text in enumerate(common)]
        write_corpus(corpus / f"part-{f}.parquet", part)
        rows += part
    return models, start_sandbox(sandbox_factory, models), corpus, rows


def test_worker_processes_pay_once_for_a_text_both_read(tmp_path, setup, claim_dirs):
    models, sandbox, corpus, rows = setup
    out = tmp_path / "out"
    assert run(corpus, out, sandbox, models, *PROCESSES) == 0
    made = [d for d in claim_dirs if "embedpipe-claims-" in os.path.basename(d)]
    assert len(made) == 1 and not os.path.exists(made[0])   # one claim file, gone with the job

    kinds = assert_every_row_once(out, rows)
    assert kinds["failed"] == kinds["pending"] == 0
    embeddings = current(out, "embeddings").to_pylist()
    charges = ledger(sandbox)
    assert billed_twice(charges) == {}
    assert sum(len(c["input_sha256"]) for c in charges) == len({r["text_sha256"] for r in embeddings})
    # a text's rows share one vector and one request, whichever process read them
    by_text = collections.defaultdict(set)
    for row in embeddings:
        by_text[row["text_sha256"]].add((tuple(row["embedding"]), row["request_id"]))
    assert all(len(outcomes) == 1 for outcomes in by_text.values())
    # the work was split (files of sent vectors from both), and some rows are copies of another's
    # outcome (grouping would have sent every row with its text)
    files = current_files(out, "embeddings")
    assert len([f for f in files if "-late-" not in f.name]) >= 2
    assert sum(pq.read_metadata(f).num_rows for f in files if "-late-" in f.name) > 0


def test_a_capped_run_leaves_late_rows_pending_and_the_resume_pays_once(tmp_path, setup):
    """Rows of a text another process claimed and left pending are pending too; --resume sends
    each such text once. The cap lets a few requests through, and the repeated texts come last
    in every file: their claims are left pending."""
    models, sandbox, corpus, rows = setup
    out = tmp_path / "out"
    assert run(corpus, out, sandbox, models, "--max-spend-rub", "0.05", "--allow-partial", *PROCESSES) == 4
    assert assert_every_row_once(out, rows)["pending"] > 0
    assert any("-late-" in f.name for f in current_files(out, "pending"))   # copies of a pending claim
    assert run(corpus, out, sandbox, models, "--resume", *PROCESSES) == 0
    kinds = assert_every_row_once(out, rows)
    assert kinds["pending"] == kinds["failed"] == 0
    assert billed_twice(ledger(sandbox)) == {}


@pytest.mark.soak   # slow: make soak
def test_worker_processes_share_a_file_of_one_row_group(tmp_path, sandbox_factory, monkeypatch):
    """A runner gives a stage's input to its workers once, at the start: one row group would go to
    one process. Pulled table by table, both read it, and every row is read once."""
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
    models = write_models(tmp_path / "models.yaml")
    rows = corpus_rows(n_short=2400, n_long=0, seed=21)
    corpus = write_corpus(tmp_path / "corpus.parquet", rows)
    assert pq.read_metadata(corpus).num_row_groups == 1
    out = tmp_path / "out"
    assert run(corpus, out, start_sandbox(sandbox_factory, models), models, *PROCESSES) == 0
    kinds = assert_every_row_once(out, rows)
    assert kinds["pending"] == 0 and kinds["failed"] == 1   # the empty text
    assert len([f for f in current_files(out, "embeddings") if "-late-" not in f.name]) >= 2
