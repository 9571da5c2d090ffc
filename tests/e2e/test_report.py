"""`python -m pipeline report DIR` over a partial run and its resume: the table sums the current
requests files (both runs), matches the ledger, and report.png is drawn when matplotlib is there."""
from __future__ import annotations

import importlib.util
import sys

import pytest

from pipeline.cli import main
from service.sandbox.launcher import SandboxProcess
from tests.conftest import SANDBOX_KEY
from tests.e2e.money_helpers import MODEL, corpus_rows, current, ledger, micro, run, write_corpus, write_models


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    """A partial run and its resume, shared by the module's tests (the report only reads)."""
    tmp = tmp_path_factory.mktemp("report")
    models = write_models(tmp / "models.yaml")
    corpus = write_corpus(tmp / "corpus.parquet", corpus_rows(n_short=80, n_long=2))
    # some 500s, so that the table has retries to count
    with pytest.MonkeyPatch.context() as mp, SandboxProcess(
            tmp / "sandbox.db", key=SANDBOX_KEY, balance=100.0,
            args=["--models", str(models), "--rate-500", "0.15", "--seed", "4"]) as sb:
        mp.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
        out = tmp / "out"
        assert run(corpus, out, sb, models, "--max-spend-rub", "0.3", "--allow-partial") == 4
        assert run(corpus, out, sb, models, "--resume") == 0
        yield out, sb


def table_row(text: str, model: str) -> list[str]:
    lines = [line.split() for line in text.splitlines() if line.startswith(model + " ")]
    assert len(lines) == 1, text
    return lines[0][1:]


def test_table_sums_the_current_requests_and_draws_the_picture(resumed, capsys):
    out, sb = resumed
    (out / "report.png").unlink(missing_ok=True)
    assert main(["report", str(out)]) == 0
    printed = capsys.readouterr().out
    requests_n, tokens, rub, per_1m, retries, searches = table_row(printed, MODEL)
    req = current(out, "requests")
    assert len(set(req.column("run_id").to_pylist())) == 2          # both runs are counted
    assert int(requests_n) == req.num_rows
    assert int(tokens) == sum(req.column("total_tokens").to_pylist())
    assert round(float(rub) * 1e6) == micro(req.column("cost_rub").to_pylist()) \
        == micro(c["cost_rub"] for c in ledger(sb))
    assert float(per_1m) == pytest.approx(100.0, rel=1e-4)
    assert int(retries) == sum(a - 1 for a in req.column("attempts").to_pylist()) > 0
    assert searches == "0"
    if importlib.util.find_spec("matplotlib") is None:
        assert "embedpipe[report]" in printed and not (out / "report.png").exists()
    else:
        assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_matplotlib_the_table_still_prints(resumed, capsys, monkeypatch):
    out, _ = resumed
    (out / "report.png").unlink(missing_ok=True)
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # what an install without the extra sees
    assert main(["report", str(out)]) == 0
    printed = capsys.readouterr().out
    assert table_row(printed, MODEL) and "pip install 'embedpipe[report]'" in printed
    assert not (out / "report.png").exists()


def test_a_directory_without_a_summary_is_a_usage_error(tmp_path):
    assert main(["report", str(tmp_path)]) == 2
