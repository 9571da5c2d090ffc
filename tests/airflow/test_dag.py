"""The Airflow DAG (configs/airflow/embed_corpus_dag.py), loaded and run by real Airflow 3.3.

Airflow lives in its own venv (.venv-airflow/, built on first use: a few minutes; see
airflow_venv.py) with a throwaway AIRFLOW_HOME and SQLite. The tasks call the project's
own `python -m pipeline` against a sandbox, as a worker with embedpipe installed would.
`make airflow-test` runs these; `make test` leaves them out.
"""
from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from tests.airflow.airflow_venv import REPO, ensure_venv, venv_python
from tests.e2e.money_helpers import MODEL, corpus_rows, write_corpus
from tests.e2e.test_switch import OTHER, billed_twice_per_model, hashes_for, view_models, write_models
from tests.e2e.test_sync import assert_current, next_day

pytestmark = pytest.mark.airflow

DAG_FOLDER = REPO / "configs" / "airflow"
DAG_ID = "embed_corpus"
LOGICAL_DATE = "2025-06-01"
KEY = "sk-airflow-test-key-7f3a9c"  # distinctive, so any leak is easy to grep
AIRFLOW_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory) -> dict[str, str]:
    """Env for the airflow CLI: a fresh home and database, the DAG folder, the interpreter
    Variable and the API key Connection as AIRFLOW_VAR_/AIRFLOW_CONN_."""
    ensure_venv()
    home = tmp_path_factory.mktemp("airflow_home")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("AIRFLOW") and k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAG_FOLDER),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW_VAR_EMBEDPIPE_PYTHON": sys.executable,  # the project venv: embedpipe installed
        "AIRFLOW_CONN_EMBEDDINGS_API": json.dumps({"conn_type": "generic", "password": KEY}),
    })
    airflow(env, "db", "migrate")
    return env


def airflow(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([str(venv_python().with_name("airflow")), *args], env=env,
                          cwd=env["AIRFLOW_HOME"], text=True, capture_output=True,
                          timeout=AIRFLOW_TIMEOUT_S)
    if check and done.returncode:
        pytest.fail(f"airflow {' '.join(args)} exited {done.returncode}:\n"
                    f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def assert_no_key(env: dict[str, str], *outputs: str) -> None:
    for text in outputs:
        assert KEY not in text
    for log in Path(env["AIRFLOW_HOME"], "logs").rglob("*"):
        if log.is_file():
            assert KEY not in log.read_text(errors="replace"), log


@pytest.fixture
def corpus(tmp_path) -> str:
    texts = [f"Document {i} about embeddings, budgets and daily schedules. " * (3 + i % 5)
             for i in range(40)]
    pq.write_table(pa.table({"id": [f"d{i}" for i in range(40)], "text": texts}),
                   tmp_path / "corpus.parquet")
    return str(tmp_path / "*.parquet")


def test_dag_loads_with_schedule_tasks_and_params(airflow_env, tmp_path):
    out = tmp_path / "facts.json"
    subprocess.run([str(venv_python()), str(Path(__file__).with_name("inspect_dag.py")),
                    str(DAG_FOLDER), str(out)],
                   env=airflow_env, check=True, capture_output=True, timeout=AIRFLOW_TIMEOUT_S)
    facts = json.loads(out.read_text())
    assert facts["import_errors"] == {}
    assert list(facts["dags"]) == [DAG_ID]
    dag = facts["dags"][DAG_ID]
    assert dag["schedule"] == "@daily"
    assert dag["catchup"] is False and dag["max_active_runs"] == 1
    assert set(dag["tasks"]) == {"plan_gate", "embed", "publish"}
    assert dag["tasks"]["plan_gate"]["downstream"] == ["embed"]
    assert dag["tasks"]["embed"]["upstream"] == ["plan_gate"]
    assert dag["tasks"]["embed"]["downstream"] == ["publish"]
    for t in dag["tasks"].values():
        assert 0 < t["retries"] <= 3 and t["has_timeout"]
    assert set(dag["params"]) >= {
        "input", "output", "model", "base_url", "max_spend_rub", "runner", "allow_partial", "switch_model",
        "dataflow_project", "dataflow_region", "dataflow_temp_location", "publish_to", "publish_conn_id",
        "publish_table", "keep_columns", "chunk_tokens"}
    assert dag["params"]["runner"] == "DirectRunner"
    assert dag["params"]["switch_model"] is False  # a model change is never implied
    # The key is read at run time inside the task: no templated field may carry it.
    for t in dag["tasks"].values():
        for value in t["template_fields"].values():
            assert "conn" not in value.lower() and "password" not in value.lower(), value


def test_rendered_fields_never_hold_the_key(airflow_env):
    for task_id in ("plan_gate", "embed", "publish"):
        done = airflow(airflow_env, "tasks", "render", DAG_ID, task_id, LOGICAL_DATE)
        assert_no_key(airflow_env, done.stdout, done.stderr)


@pytest.fixture
def planned(sandbox_factory, corpus) -> tuple:
    """(sandbox whose balance covers the corpus, the plan's JSON). A plan that fails here is
    the pipeline's bug, not the DAG's: it fails the test instead of hiding it."""
    sb = sandbox_factory(key=KEY, balance=1000.0)
    done = subprocess.run([sys.executable, "-m", "pipeline", "plan", "--input", corpus, "--model",
                           "text-embedding-3-small", "--base-url", sb.base_url, "--json"],
                          env={**os.environ, "EMBEDDINGS_API_KEY": KEY}, capture_output=True,
                          text=True, timeout=AIRFLOW_TIMEOUT_S)
    assert done.returncode == 0, f"`python -m pipeline plan` failed (exit {done.returncode}): {done.stderr[-4000:]}"
    return sb, json.loads(done.stdout)


def run_task(airflow_env, task_id: str, params: dict) -> tuple[str, str]:
    """Run one task with PARAMS; return (its final state, all output). `airflow tasks test`
    exits 0 whatever the task does, so the state comes from its log."""
    done = airflow(airflow_env, "tasks", "test", DAG_ID, task_id, LOGICAL_DATE,
                   "-t", json.dumps(params))
    output = done.stdout + done.stderr
    states = re.findall(r"new_state=(\w+)", output)
    assert states, output[-4000:]
    assert_no_key(airflow_env, output)
    return states[-1], output


def test_plan_gate_passes_when_the_estimate_fits(airflow_env, planned, corpus):
    sb, _ = planned
    state, output = run_task(airflow_env, "plan_gate",
                             {"input": corpus, "base_url": sb.base_url, "max_spend_rub": 10.0})
    assert state == "success", output[-4000:]
    assert "'fits': True" in output
    assert sb.ledger() == []  # plan sends no embeddings request


def test_plan_gate_fails_without_retry_naming_estimate_and_spendable(airflow_env, planned, corpus):
    sb, _ = planned
    state, output = run_task(airflow_env, "plan_gate",
                             {"input": corpus, "base_url": sb.base_url, "max_spend_rub": 0.000001})
    assert state == "failed", output[-4000:]  # not up_for_retry: retrying cannot make it fit
    assert re.search(r"estimate [0-9.]+ RUB exceeds spendable 0.000001 RUB", output), output[-4000:]
    assert sb.ledger() == []


def test_plan_gate_lets_a_partial_run_through_when_allowed(airflow_env, planned, corpus):
    sb, _ = planned
    state, output = run_task(airflow_env, "plan_gate",
                             {"input": corpus, "base_url": sb.base_url, "max_spend_rub": 0.000001,
                              "allow_partial": True})
    assert state == "success", output[-4000:]
    assert "allow_partial is set" in output


@pytest.fixture
def small_requests_profile(tmp_path) -> str:
    """A --profile whose model catalogue caps requests at 8 inputs, so that the corpus takes
    several requests and a budget can run out between them."""
    models = yaml.safe_load((REPO / "configs" / "models.yaml").read_text())
    models["models"]["text-embedding-3-small"]["max_inputs_per_request"] = 8
    (tmp_path / "models.yaml").write_text(yaml.safe_dump(models))
    profile = tmp_path / "small-requests.yaml"
    profile.write_text(yaml.safe_dump({"models_config": str(tmp_path / "models.yaml")}))
    return str(profile)


def test_embed_partial_then_resumed_by_the_next_run(airflow_env, planned, corpus, tmp_path,
                                                    small_requests_profile):
    """Day 1: half the estimate -> exit 4 -> success with outcome "partial", no retry.
    Day 2: enough budget -> the same command resumes -> outcome "done", nothing paid twice."""
    sb, plan = planned
    params = {"input": corpus, "output": str(tmp_path / "out"), "base_url": sb.base_url,
              "allow_partial": True, "profile": small_requests_profile}
    state, output = run_task(airflow_env, "embed",
                             {**params, "max_spend_rub": plan["estimated_cost_rub"] / 2})
    assert state == "success", output[-4000:]
    assert "'outcome': 'partial'" in output, output[-4000:]
    paid_day1 = sb.ledger()
    assert paid_day1

    state, output = run_task(airflow_env, "embed", {**params, "max_spend_rub": 10.0})
    assert state == "success", output[-4000:]
    assert "'outcome': 'done'" in output, output[-4000:]
    sent = [h for charge in sb.ledger() for h in charge["input_sha256"]]
    assert len(sb.ledger()) > len(paid_day1)
    assert len(sent) == len(set(sent))  # --resume: no text paid for twice


def test_keep_columns_and_chunk_tokens_reach_the_commands(airflow_env, planned, tmp_path):
    """keep_columns and chunk_tokens become plan's and run's flags: the view keeps the columns,
    cut at the chunk size; another keep_columns the next day is adopted with every vector
    reused (0 requests)."""
    sb, _ = planned
    rows = [{"id": f"d{i}", "text": f"Document {i} about budgets and schedules. " * (20 + i), "title": f"T{i}",
             "lang": "en"} for i in range(12)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "kept.parquet")
    out = tmp_path / "out"
    params = {"input": str(tmp_path / "kept.parquet"), "output": str(out), "base_url": sb.base_url,
              "max_spend_rub": 10.0, "keep_columns": "title", "chunk_tokens": 64}
    state, output = run_task(airflow_env, "plan_gate", params)
    assert state == "success" and "--keep-columns title --chunk-tokens 64" in output, output[-4000:]
    state, output = run_task(airflow_env, "embed", params)
    assert state == "success" and "--keep-columns title --chunk-tokens 64" in output, output[-4000:]
    view = pa.concat_tables([pq.read_table(f) for f in sorted((out / "current").glob("embeddings-*.parquet"))])
    assert "title" in view.column_names and "lang" not in view.column_names
    assert max(view["n_tokens"].to_pylist()) <= 64 < sum(view["n_tokens"].to_pylist()) / len(rows)
    paid = len(sb.ledger())

    state, output = run_task(airflow_env, "embed", {**params, "keep_columns": "title,lang"})
    assert state == "success" and returned(output)["outcome"] == "done", output[-4000:]
    view = pa.concat_tables([pq.read_table(f) for f in sorted((out / "current").glob("embeddings-*.parquet"))])
    assert {"title", "lang"} <= set(view.column_names)
    assert len(sb.ledger()) == paid   # the new columns adopted, every vector reused


def returned(output: str) -> dict:
    """The task's XCom, as `airflow tasks test` logs it."""
    found = re.findall(r"Returned value was: (\{.*\})", output)
    assert found, output[-4000:]
    return ast.literal_eval(found[-1])


def test_two_days_on_a_changing_corpus_keep_one_output_current(airflow_env, planned, corpus, tmp_path):
    """Day 1 embeds the corpus; by day 2 documents were edited, removed and added. The same
    daily task makes the output's current view exactly day 2's corpus, pays only for the new
    texts, and its XCom says what changed."""
    sb, _ = planned
    out = tmp_path / "out"
    params = {"input": corpus, "output": str(out), "base_url": sb.base_url, "max_spend_rub": 10.0}
    state, output = run_task(airflow_env, "embed", params)
    assert state == "success", output[-4000:]
    day1 = pq.read_table(tmp_path / "corpus.parquet").to_pylist()
    assert returned(output)["changes"]["added"] == len(day1)
    paid = sb.ledger()

    day2 = [{**r, "text": r["text"] + " Edited on day two."} if i < 5 else r for i, r in enumerate(day1)][:-3]
    day2 += [{"id": f"new-{i}", "text": f"Document {i} added on day two, about schedules."} for i in range(4)]
    pq.write_table(pa.Table.from_pylist(day2), tmp_path / "corpus.parquet")
    state, output = run_task(airflow_env, "plan_gate", params)
    assert state == "success" and "'added': 4" in output, output[-4000:]
    state, output = run_task(airflow_env, "embed", params)
    assert state == "success", output[-4000:]
    xcom = returned(output)
    assert xcom["outcome"] == "done"
    assert xcom["changes"] == {"added": 4, "edited": 5, "removed": 3, "unchanged": len(day1) - 8, "resumed": 0}
    assert xcom["current"]["documents"] == len(day2) and xcom["current"]["pending"] == 0

    current = pa.concat_tables([pq.read_table(f) for f in sorted((out / "current").glob("embeddings-*.parquet"))])
    served = {(r["doc_id"], r["text_sha256"]) for r in current.to_pylist()}
    assert served == {(r["id"], hashlib.sha256(r["text"].encode()).hexdigest()) for r in day2}
    sent = [h for charge in sb.ledger() for h in charge["input_sha256"]]
    assert len(sent) == len(set(sent))   # nothing paid twice
    assert len(sb.ledger()) > len(paid)


def test_a_switch_over_two_days_on_a_changing_corpus(airflow_env, sandbox_factory, tmp_path):
    """Day 0 serves MODEL. Day 1, switch_model to OTHER under a cap that covers the day's
    changes and about half of OTHER's view: partial, current/ still exactly the day's corpus in
    MODEL. Day 2, the corpus changed again and the budget suffices: the switch completes and
    current/ is exactly day 2's corpus in OTHER. No (model, text) is paid twice."""
    models = write_models(tmp_path / "models.yaml")   # small requests: a cap stops between them
    sb = sandbox_factory(key=KEY, balance=1000.0, args=["--models", str(models)])
    profile = tmp_path / "switch.yaml"
    profile.write_text(yaml.safe_dump({"models_config": str(models)}))
    day = corpus_rows(n_short=16, n_long=2)
    corpus, out = write_corpus(tmp_path / "corpus.parquet", day), tmp_path / "out"
    params = {"input": str(corpus), "output": str(out), "base_url": sb.base_url, "profile": str(profile),
              "max_spend_rub": 10.0}
    state, output = run_task(airflow_env, "embed", params)
    assert state == "success", output[-4000:]
    assert returned(output)["outcome"] == "done" and returned(output)["switch"] is None

    day, _ = next_day(day, seed=1, edit_short=2, edit_long=1, remove=1, add=2)
    write_corpus(corpus, day)
    # another model without switch_model: refused, and the job's own flag is named as the param
    state, output = run_task(airflow_env, "plan_gate", {**params, "model": OTHER})
    assert state == "failed" and "set the param switch_model to true" in output, output[-4000:]
    switching = {**params, "model": OTHER, "switch_model": True, "allow_partial": True}
    state, output = run_task(airflow_env, "plan_gate", switching)
    assert state == "success", output[-4000:]
    plan = returned(output)
    assert plan["switch"]["to"]["model"] == OTHER and plan["served"]["model"] == MODEL
    cap = plan["served"]["estimated_cost_rub"] + plan["target"]["estimated_cost_rub"] / 2
    state, output = run_task(airflow_env, "embed", {**switching, "max_spend_rub": round(cap, 6)})
    assert state == "success", output[-4000:]   # exit 4 is partial, not a failure
    xcom = returned(output)
    assert xcom["outcome"] == "partial" and xcom["exit_code"] == 4, xcom
    switch = xcom["switch"]
    assert not switch["switched"] and switch["from"]["model"] == MODEL and switch["to"]["model"] == OTHER
    assert 0 < switch["documents_done"] < switch["documents_total"] == len({r["id"] for r in day}), switch
    assert switch["spent_rub"] > 0 and switch["estimated_rub_to_finish"] > 0 and switch["run"]["embedded"] > 0
    assert f"switching {out} from {MODEL} to {OTHER}" in output, output[-4000:]
    assert f"partial: the switch to {OTHER} is not complete" in output
    assert view_models(out, "current") == {MODEL} and view_models(out, "target") == {OTHER}
    assert_current(out, models, day)            # the served view kept exactly the day's corpus
    assert billed_twice_per_model(sb.ledger()) == {}

    day, _ = next_day(day, seed=2, edit_short=2, edit_long=1, remove=1, add=2)
    write_corpus(corpus, day)
    state, output = run_task(airflow_env, "plan_gate", switching)
    assert state == "success" and returned(output)["fits"], output[-4000:]
    state, output = run_task(airflow_env, "embed", switching)
    assert state == "success", output[-4000:]
    xcom = returned(output)
    assert xcom["outcome"] == "done" and xcom["switch"]["switched"], xcom
    assert xcom["switch"]["documents_done"] == xcom["switch"]["documents_total"] == len({r["id"] for r in day})
    assert f"switched {out}/current/ from {MODEL} to {OTHER}" in output, output[-4000:]
    assert view_models(out, "current") == {OTHER} and not (out / "target").exists()
    served = {}
    for f in sorted((out / "current").glob("embeddings-*.parquet")):
        for r in pq.read_table(f, columns=["doc_id", "text_sha256"]).to_pylist():
            served.setdefault(r["doc_id"], set()).add(r["text_sha256"])
    assert served == hashes_for(models, day, OTHER)
    assert {c["model"] for c in sb.ledger()} == {MODEL, OTHER}
    assert billed_twice_per_model(sb.ledger()) == {}


def test_publish_after_each_day_keeps_the_table_the_view(airflow_env, planned, corpus, reachable_tmp):
    """The publish task after embed: skipped without a database; with the embedded one, the
    table is the view after each day; a table not ours fails without retries (exit 2)."""
    import psycopg

    from pipeline.publish.embedded import embedded
    from tests.publish.helpers import assert_same
    sb, _ = planned
    out = reachable_tmp / "out"   # the embedded PostgreSQL runs as another user, who must reach it
    params = {"input": corpus, "output": str(out), "base_url": sb.base_url, "max_spend_rub": 10.0}
    assert run_task(airflow_env, "embed", params)[0] == "success"
    assert run_task(airflow_env, "publish", params)[0] == "skipped"
    state, output = run_task(airflow_env, "publish", {**params, "publish_to": "embedded"})
    assert state == "success", output[-4000:]
    with embedded(str(out)) as db:
        assert_same(out, db.url)
    rows = pq.read_table(corpus.replace("*.parquet", "corpus.parquet")).to_pylist()
    rows[0]["text"] = "An edited first document about something else entirely."
    pq.write_table(pa.Table.from_pylist(rows[1:] + [rows[0]]), corpus.replace("*.parquet", "corpus.parquet"))
    assert run_task(airflow_env, "embed", params)[0] == "success"
    state, output = run_task(airflow_env, "publish", {**params, "publish_to": "embedded"})
    assert state == "success" and "'action': 'delta'" in output, output[-4000:]
    with embedded(str(out)) as db:
        assert_same(out, db.url)
        with psycopg.connect(db.url, autocommit=True) as conn:
            conn.execute("CREATE TABLE theirs (x int)")
    state, output = run_task(airflow_env, "publish", {**params, "publish_to": "embedded", "publish_table": "theirs"})
    assert state == "failed" and "usage error (exit 2)" in output, output[-4000:]
