"""search: the published table's nearest chunks, the query paid once and kept in DIR's history
as a run's request; --like pays nothing."""
from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq

from pipeline.cli import main
from pipeline.terminal.figures import exact
from tests.e2e.money_helpers import MODEL, balances, corpus_rows, micro
from tests.e2e.test_sync import next_day
from tests.publish.helpers import publish, view_rows


def search(capsys, *args) -> dict:
    capsys.readouterr()
    assert main(["search", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def exact_nearest(out, doc_id: str, k: int) -> list[tuple]:
    rows = list(view_rows(out).values())
    vectors = np.stack([np.frombuffer(r["embedding"], np.float32) for r in rows])
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    first = min((r for r in rows if r["doc_id"] == doc_id), key=lambda r: (r["chunk_index"], r["token_start"]))
    scores = unit @ (np.frombuffer(first["embedding"], np.float32) / np.linalg.norm(
        np.frombuffer(first["embedding"], np.float32)))
    order = [i for i in np.argsort(-scores) if rows[i]["doc_id"] != doc_id][:k]
    return [(rows[i]["doc_id"], rows[i]["chunk_index"]) for i in order]


def test_search_by_document_and_by_text(days, pg_url, capsys):
    assert days(corpus_rows(n_short=60, n_long=2)) == 0
    assert publish(days.out, pg_url) == 0
    like = search(capsys, str(days.out), "--like", "s-5", "-k", "5", "--to", pg_url)
    assert like["request"] is None and len(like["results"]) == 5
    assert [(r["doc_id"], r["chunk_index"]) for r in like["results"]] == exact_nearest(days.out, "s-5", 5)

    text = pq.read_table(next((days.out / "current").glob("embeddings-*.parquet")), columns=["doc_id"])
    assert text.num_rows
    charges = len(days.sandbox_ledger())
    found = search(capsys, str(days.out), "budget vector rouble", "--to", pg_url, "--base-url", days.base_url,
                   "--models-config", str(days.models))
    assert len(found["results"]) == 10 and found["model"] == MODEL
    request = found["request"]
    assert request["cost_rub"] > 0 and len(days.sandbox_ledger()) == charges + 1
    assert days.sandbox_ledger()[-1]["request_id"] == request["request_id"]
    kept = pq.read_table(days.out / request["recorded_in"]).to_pylist()
    assert [r["request_id"] for r in kept] == [request["request_id"]] and kept[0]["cost_rub"] == request["cost_rub"]
    record = json.loads((days.out / "_runs" / f"{kept[0]['run_id']}.json").read_text())
    assert record["mode"] == "search"


def test_a_text_search_takes_the_service_of_dirs_last_run(days, pg_url, capsys, caplog):
    """DIR's runs keep the service's base URL (never the key): a text search needs no --base-url.
    A DIR whose runs kept none asks for it."""
    from tests.conftest import SANDBOX_KEY
    assert days(corpus_rows(n_short=20, n_long=0)) == 0
    assert publish(days.out, pg_url) == 0
    records = [json.loads(p.read_text()) for p in (days.out / "_runs").glob("*.json")]
    assert [r["base_url"] for r in records] == [days.base_url]
    charges = len(days.sandbox_ledger())
    found = search(capsys, str(days.out), "budget vector", "--to", pg_url, "--models-config", str(days.models))
    assert found["request"]["cost_rub"] > 0 and len(days.sandbox_ledger()) == charges + 1
    assert f"the query goes to {days.base_url}, the service of {days.out}'s last run" in caplog.text
    assert not [p for p in days.out.rglob("*") if p.is_file() and SANDBOX_KEY.encode() in p.read_bytes()]
    root = days.base_url.removesuffix("/v1")   # typed without /v1: named, nothing paid
    assert main(["search", str(days.out), "budget", "--to", pg_url, "--base-url", root,
                 "--models-config", str(days.models)]) == 2
    assert f"and {days.base_url} answers: pass --base-url {days.base_url}" in caplog.text
    assert len(days.sandbox_ledger()) == charges + 1
    for path in (days.out / "_runs").glob("*.json"):   # runs recorded before DIR kept the base URL
        path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items() if k != "base_url"}))
    caplog.clear()
    assert main(["search", str(days.out), "budget", "--to", pg_url, "--models-config", str(days.models)]) == 2
    assert "give --base-url URL (DIR's runs recorded none)" in caplog.text


def test_search_needs_a_published_table_and_one_query(days, pg_url, caplog):
    assert days(corpus_rows(n_short=10, n_long=0)) == 0
    assert main(["search", str(days.out), "--like", "s-1", "--to", pg_url]) == 2
    assert "is not a table embedpipe published" in caplog.text
    assert main(["search", str(days.out), "--to", pg_url]) == 2
    assert main(["search", str(days.out), "text", "--like", "s-1", "--to", pg_url]) == 2


def test_over_2000_dimensions_the_index_is_on_halfvec_and_search_uses_it(tmp_path, sandbox_factory, env_key,
                                                                         pg_url, capsys):
    import psycopg
    import yaml

    from tests.e2e.money_helpers import run, start_sandbox, write_corpus, write_models
    from tests.publish.helpers import assert_same
    models = write_models(tmp_path / "models.yaml")
    doc = yaml.safe_load(models.read_text())
    doc["models"][MODEL]["dimensions"] = 2100
    models.write_text(yaml.safe_dump(doc))
    sandbox = start_sandbox(sandbox_factory, models)
    out = tmp_path / "out"
    assert run(write_corpus(tmp_path / "c.parquet", corpus_rows(n_short=30, n_long=0)), out, sandbox, models) == 0
    assert publish(out, pg_url) == 0
    assert_same(out, pg_url)
    with psycopg.connect(pg_url) as conn:
        indexes = " ".join(r[0] for r in conn.execute("SELECT indexdef FROM pg_indexes WHERE indexdef LIKE '%hnsw%'"))
        assert "halfvec(2100)" in indexes and "halfvec_cosine_ops" in indexes
        conn.execute("SET enable_seqscan = off")
        plan = " ".join(r[0] for r in conn.execute(
            "EXPLAIN SELECT doc_id FROM embeddings ORDER BY embedding::halfvec(2100) <=> "
            "(SELECT embedding FROM embeddings LIMIT 1)::halfvec(2100) LIMIT 5"))
        assert "_hnsw" in plan
    like = search(capsys, str(out), "--like", "s-3", "-k", "3", "--to", pg_url)
    assert len(like["results"]) == 3 and all(r["doc_id"] != "s-3" for r in like["results"])


def test_a_search_is_named_in_the_next_runs_reconciliation(days, pg_url, capsys):
    """A paid search is a request without rows that is not lost: the next run's reconciliation
    counts it as a search, DIR reconciles to the micro-rouble with the sandbox's ledger, and the
    short summary's money line names it and balances as printed. `report` counts it, before
    the next run and after it, once."""
    rows = corpus_rows(n_short=40, n_long=1)
    assert days(rows) == 0
    assert publish(days.out, pg_url) == 0
    found = search(capsys, str(days.out), "budget vector rouble", "--to", pg_url, "--base-url", days.base_url,
                   "--models-config", str(days.models))
    assert report_row(capsys, days.out)["searches"] == "1"   # in DIR's history, not in the view yet
    assert days(next_day(rows, edit_short=2, edit_long=0, remove=1, add=2)[0], "--sync") == 0
    money = [line for line in capsys.readouterr().out.splitlines() if line.split()[:1] == ["money"]]
    s = json.loads((days.out / "summary.json").read_text())
    recon = s["reconciliation"]
    billed = micro(c["cost_rub"] for c in days.sandbox_ledger())
    assert recon["searches"] == {"count": 1, "rub": found["request"]["cost_rub"]}
    assert recon["lost"]["count"] == 0 and recon["others_rub"] == 0 and recon["unexplained_rub"] == 0
    assert micro([recon["balance_delta_rub"]]) == billed == \
        micro([recon["rows_cost_rub"], recon["searches"]["rub"]]) > micro([recon["rows_cost_rub"]])
    assert recon["notes"] == []
    assert len(money) == 1 and f" + searches {exact(recon['searches']['rub'])} RUB over 3 runs" in money[0], money
    assert balances(money[0]), money
    table = report_row(capsys, days.out)
    assert table["searches"] == "1" and int(table["requests"]) == len(days.sandbox_ledger())
    assert round(float(table["RUB"]) * 1e6) == billed


def report_row(capsys, out) -> dict[str, str]:
    """`report DIR`'s row of the model, by column."""
    capsys.readouterr()
    assert main(["report", str(out)]) == 0
    row = next(line.split() for line in capsys.readouterr().out.splitlines() if line.startswith(MODEL + " "))
    return dict(zip(["model", "requests", "tokens", "RUB", "per_1m", "retries", "searches"], row, strict=True))


def test_a_search_that_pays_is_refused_while_a_run_writes_dir(days, pg_url, caplog):
    from pipeline.outdir.lock import OutputLock
    from pipeline.settings.steps import run_settings
    assert days(corpus_rows(n_short=10, n_long=0)) == 0
    assert publish(days.out, pg_url) == 0
    charges = len(days.sandbox_ledger())
    with OutputLock(str(days.out), "20260101T000000Z-abcdef", run_settings(None).lock):   # a live run's
        assert main(["search", str(days.out), "budget", "--to", pg_url, "--base-url", days.base_url,
                     "--models-config", str(days.models)]) == 2
    assert "is being written by another run" in caplog.text and "then search again" in caplog.text
    assert len(days.sandbox_ledger()) == charges and not list((days.out / "history").glob("*/*search*"))
    assert main(["search", str(days.out), "--like", "s-1", "--to", pg_url]) == 0   # reads only: no lock


def test_a_full_disk_while_a_search_keeps_its_request_leaves_no_torn_file(tmp_path, small_disk, sandbox_factory,
                                                                           env_key, pg_url, caplog):
    """DIR on a tmpfs with one page free: what the search writes is whole or absent, and the
    next run reads DIR's history as before."""
    from pipeline.outdir.space import free_bytes
    from tests.conftest import fill, make_free
    from tests.e2e.money_helpers import run, start_sandbox, write_corpus, write_models
    models = write_models(tmp_path / "models.yaml")
    sandbox = start_sandbox(sandbox_factory, models)
    corpus = write_corpus(tmp_path / "corpus.parquet", corpus_rows(n_short=20, n_long=0))
    out = small_disk / "out"
    assert run(corpus, out, sandbox, models) == 0
    assert publish(out, pg_url) == 0
    filler = fill(small_disk, 4096)
    caplog.clear()
    assert main(["search", str(out), "budget", "--to", pg_url, "--base-url", sandbox.base_url, "--models-config",
                 str(models)]) == 1
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and errors[0].startswith(f"no space left on the disk of {out}"), errors
    for found in out.glob("history/*/*.parquet"):
        pq.read_metadata(found)   # whole
    assert not [p for p in out.rglob("*") if ".tmp-" in p.name]
    make_free(small_disk, filler, free_bytes(small_disk) + (1 << 20))
    assert run(corpus, out, sandbox, models, "--sync") == 0
