"""Several local worker processes stream as one does, and share their claims through a file: a
text whose rows reach both is paid once, and every row gets its vector."""
from __future__ import annotations

import collections
import tempfile

from tests.conftest import SANDBOX_KEY
from tests.e2e.helpers import current_files
from tests.e2e.money_helpers import (assert_every_row_once, billed_twice, corpus_rows, current, ledger, run,
                                     start_sandbox, write_corpus, write_models)

FILES = 6
PROCESSES = ("--direct_num_workers", "2", "--direct_running_mode", "multi_processing")


def _corpus(root) -> list[dict]:
    """FILES files, each with texts of its own and the same few texts under other ids."""
    root.mkdir()
    common = [r["text"] for r in corpus_rows(n_short=6, n_long=1, seed=5)[:7]]
    rows = []
    for f in range(FILES):
        part = corpus_rows(n_short=30, n_long=0, seed=10 + f, prefix=f"f{f}-")[:30]
        part += [{"id": f"f{f}-common-{i}", "text": text} for i, text in enumerate(common)]
        write_corpus(root / f"part-{f}.parquet", part)
        rows += part
    return rows


def test_worker_processes_pay_once_for_a_text_both_read(tmp_path, sandbox_factory, monkeypatch):
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
    models = write_models(tmp_path / "models.yaml")
    sandbox = start_sandbox(sandbox_factory, models)
    rows = _corpus(tmp_path / "corpus")
    out, temp = tmp_path / "out", tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    assert run(tmp_path / "corpus", out, sandbox, models, *PROCESSES) == 0
    assert list(temp.iterdir()) == []   # the claim file went with the job

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
    # the work was split (two files of sent vectors), so both processes read the repeated texts
    assert len([f for f in current_files(out, "embeddings") if "-late-" not in f.name]) == 2
