"""A 400 that is about the request, not an input (here: a `dimensions` the service does not
support for the model), must not be bisected down to every single input."""
from __future__ import annotations

from importlib import resources
from pathlib import Path

import yaml

from tests.conftest import SANDBOX_KEY
from tests.e2e.helpers import ledger, read_kind, run, summary, write_corpus

MODEL = "text-embedding-ada-002"


def test_the_same_refusal_for_input_after_input_stops_the_run(tmp_path: Path, sandbox_factory, monkeypatch):
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
    # our catalogue (wrongly) says the model can shorten its vectors; the service says no
    raw = yaml.safe_load(resources.files("configs").joinpath("models.yaml").read_text())
    raw["models"][MODEL]["supports_dimensions"] = True
    models = tmp_path / "models.yaml"
    models.write_text(yaml.safe_dump(raw))
    rows = [{"id": f"d{i}", "text": f"document number {i} about vectors", "lang": "en"} for i in range(64)]
    corpus, out = write_corpus(tmp_path / "c.parquet", rows), tmp_path / "out"
    sb = sandbox_factory(key=SANDBOX_KEY, balance=10.0)
    code = run("--input", str(corpus), "--output", str(out), "--model", MODEL, "--base-url", sb.base_url,
               "--models-config", str(models), "--dimensions", "256", "--max-in-flight", "1")
    assert code == 1
    s = summary(out)
    assert s["pending_reasons"] == {"invalid_answers": s["pending"]}
    assert s["failed_reasons"] == {"bad_request": 3}
    assert s["pending"] + s["failed"] + s["embedded"] == len(rows)
    assert s["requests"] < 2 * len(rows) - 1 and s["requests"] <= 12
    assert ledger(sb.db) == []  # nothing was billed
    assert read_kind(out, "embeddings").num_rows == 0
