"""embed_corpus: embed a Parquet corpus once a day, gated by the cost plan (configs/airflow/README.md).

    plan_gate >> embed >> publish

**plan_gate** runs `python -m pipeline plan --output OUTPUT --sync --json`: what the day's run
would pay for. Exit 0 goes on; 3 fails at once ("estimate X RUB exceeds spendable Y RUB"), or
only warns with `allow_partial`; 2 fails without retries.

**embed** runs `python -m pipeline run ... --sync --json`: 0 is `done` and 4 `partial` (both
succeed; the XCom has `outcome`, `changes`, `current` and, during a model switch, `switch`);
2 and 3 fail without retries; 1 and others are retried (`--sync` pays nothing twice).

**publish** runs `python -m pipeline publish OUTPUT --to TARGET --table NAME --json` after embed
(done or partial): a PostgreSQL table serves OUTPUT's view (docs/postgres.md). TARGET is the
`publish_to` param (`embedded`, or a URL without a password) or the Connection `publish_conn_id`
(its password reaches the child only as PGPASSWORD); neither set: skipped. Exit 0 succeeds; 2
fails without retries; 1 is retried (a failed publish leaves the table as it was).

**keep_columns**, **chunk_tokens**: plan's and run's `--keep-columns` and `--chunk-tokens` (other
kept columns are adopted at no cost; other chunks are a switch). **switch_model** moves OUTPUT to
the `model` (or `chunk_tokens`) param with `--switch-model`; the run that completes it switches.

**A subprocess task, not BeamRunPythonPipelineOperator**: on Dataflow that operator stops reading
the launcher once the job id appears (no exit code, no summary), and its command line has no place
for `run`. Killing the task interrupts the launcher (SIGINT, then SIGKILL). **The API key** is the password of the Connection
`embeddings_api`, handed to the child only as `EMBEDDINGS_API_KEY` (never on the command line,
in Beam options or a templated field); Dataflow workers read it from the secret manager
(`api_key_secret`). **The interpreter** is the Variable `embedpipe_python` (default: this python).
"""
from __future__ import annotations

import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import tempfile
from datetime import timedelta
from urllib.parse import quote

import pendulum
from airflow.sdk import DAG, BaseHook, Param, Variable, get_current_context, task
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

DAG_ID = "embed_corpus"
API_CONN_ID = "embeddings_api"
PYTHON_VARIABLE = "embedpipe_python"
KEY_ENV_VAR = "EMBEDDINGS_API_KEY"

PLAN_TIMEOUT_S = 15 * 60           # plan reads the input and asks for the balance only
PUBLISH_TIMEOUT = timedelta(hours=6)  # a model switch's first publish builds the whole index
RUN_TIMEOUT = timedelta(hours=12)  # one day's run must end before the next one starts
STOP_GRACE_S = 60                  # after SIGINT, time for the job to finish its journal

# `python -m pipeline` exit codes (configs/airflow/README.md)
EXIT_OK, EXIT_USAGE, EXIT_DOES_NOT_FIT, EXIT_PARTIAL = 0, 2, 3, 4

log = logging.getLogger(__name__)


def _python() -> str:
    return Variable.get(PYTHON_VARIABLE, default=sys.executable)


def _child_env() -> dict[str, str]:
    key = BaseHook.get_connection(API_CONN_ID).password
    if not key:
        raise AirflowFailException(
            f"the Airflow connection {API_CONN_ID!r} has no password: put the API key there")
    return {**os.environ, KEY_ENV_VAR: key}


def _shared_args(p) -> list[str]:
    """Flags that plan and run take alike."""
    args = ["--input", p["input"], "--model", p["model"], "--base-url", p["base_url"]]
    for name in ("max_spend_rub", "daily_cap_rub", "monthly_cap_rub"):
        if p[name] is not None:
            args += ["--" + name.replace("_", "-"), str(p[name])]
    if p["keep_columns"]:
        args += ["--keep-columns", p["keep_columns"]]
    if p["chunk_tokens"] is not None:
        args += ["--chunk-tokens", str(p["chunk_tokens"])]
    if p["profile"]:
        args += ["--profile", p["profile"]]
    if p["switch_model"]:
        args.append("--switch-model")
    return args


def _runner_args(p) -> list[str]:
    args = ["--runner", p["runner"]]
    if p["runner"] == "DataflowRunner":
        args += ["--project", p["dataflow_project"], "--region", p["dataflow_region"],
                 "--temp_location", p["dataflow_temp_location"]]
        if p["api_key_secret"]:
            args += ["--api-key-secret", p["api_key_secret"]]
    return args


def _rub(value) -> str:
    """Roubles to the millionth the service bills in, without float noise or exponents."""
    if not isinstance(value, (int, float)):
        return "?"
    return f"{value:.6f}".rstrip("0").rstrip(".")


def _stream(cmd: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run CMD with its log (stderr) in the task log, line by line; return (its exit code,
    what it printed on stdout)."""
    log.info("running: %s", shlex.join(cmd))
    with tempfile.TemporaryFile("w+", encoding="utf-8") as stdout:
        proc = subprocess.Popen(cmd, env=env, stdout=stdout, stderr=subprocess.PIPE, text=True, errors="replace")
        try:
            for line in proc.stderr or ():   # a pipe: always there
                log.info("%s", line.rstrip())
            code = proc.wait()
        except BaseException:
            # Task killed or timed out: SIGINT lets the job log where it stopped (what it paid
            # for is already journaled), SIGKILL if it does not end in time.
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
        stdout.seek(0)
        return code, stdout.read()


def _figures(stdout: str) -> dict:
    """The day's changes, the view's figures and the switch under way (None: none), from the
    summary `run --json` printed."""
    try:
        summary = json.loads(stdout)
    except json.JSONDecodeError:
        log.warning("pipeline run --json did not print its summary; the XCom has no figures")
        return {}
    return {"changes": summary.get("changes"), "current": summary.get("current"), "run_id": summary.get("run_id"),
            "switch": summary.get("switch")}


def _switching(figures: dict) -> dict | None:
    """The switch under way in OUTPUT or ended by this run, if any: a summary with only
    `abandoned` (a switch given up, which the job logs itself) has none."""
    switch = figures.get("switch")
    return switch if switch and switch.get("to") else None


def _log_switch(switch: dict, output: str) -> None:
    """How far the switch got, in one line of the task log."""
    output = output.rstrip("/")
    moves = f"{switch['from']['model']} to {switch['to']['model']}"
    if switch["switched"]:
        log.info("switched %s/current/ from %s: it serves %s only now", output, moves,
                 switch["to"]["model"])
        return
    log.info("switching %s from %s: %d of %d documents in %s/%s, %s RUB spent on it, about %s RUB to "
             "finish; current/ serves %s until then", output, moves,
             switch["documents_done"], switch["documents_total"], output, switch["view"],
             _rub(switch["spent_rub"]), _rub(switch["estimated_rub_to_finish"]), switch["from"]["model"])


@task(task_id="plan_gate", execution_timeout=timedelta(seconds=PLAN_TIMEOUT_S + 60))
def plan_gate() -> dict:
    p = get_current_context()["params"]
    cmd = [_python(), "-m", "pipeline", "plan", *_shared_args(p), "--output", p["output"], "--sync", "--json"]
    log.info("running: %s", shlex.join(cmd))
    try:
        done = subprocess.run(cmd, env=_child_env(), capture_output=True, text=True,
                              errors="replace", timeout=PLAN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise AirflowException(f"pipeline plan did not finish in {PLAN_TIMEOUT_S} s") from None
    for line in done.stderr.splitlines():
        log.info("%s", line)
    if done.returncode == EXIT_USAGE:
        # the job names its own flag; here that flag is a param
        hint = ("; to move the output to this model, set the param switch_model to true"
                if "--switch-model" in done.stderr and not p["switch_model"] else "")
        raise AirflowFailException(f"pipeline plan: usage or input error (exit 2), see the log{hint}")
    if done.returncode not in (EXIT_OK, EXIT_DOES_NOT_FIT):
        raise AirflowException(f"pipeline plan failed with exit code {done.returncode}")
    try:
        plan = json.loads(done.stdout)
    except json.JSONDecodeError:
        raise AirflowException("pipeline plan --json did not print one JSON object") from None
    log.info("plan: %s", json.dumps(plan, sort_keys=True))
    if done.returncode == EXIT_DOES_NOT_FIT:
        why = (f"estimate {_rub(plan.get('estimated_cost_rub'))} RUB exceeds spendable "
               f"{_rub(plan.get('spendable_rub'))} RUB ({plan.get('binding_limit')} binds)")
        if not p["allow_partial"]:
            over_days = " (a switch then takes as many days as the budget needs)" if "switch" in plan else ""
            raise AirflowFailException(f"{why}: nothing was sent. Raise that limit or the "
                                       f"balance, or set allow_partial{over_days}.")
        log.warning("%s: allow_partial is set, embed spends what fits and leaves the rest pending",
                    why)
    return plan


@task(task_id="embed", execution_timeout=RUN_TIMEOUT)
def embed() -> dict:
    p = get_current_context()["params"]
    cmd = [_python(), "-m", "pipeline", "run", *_shared_args(p), "--output", p["output"],
           "--sync", "--json", *_runner_args(p)]
    if p["allow_partial"]:
        cmd.append("--allow-partial")
    code, stdout = _stream(cmd, _child_env())
    if code in (EXIT_OK, EXIT_PARTIAL):
        figures = _figures(stdout)
        switch = _switching(figures)
        if switch:
            _log_switch(switch, p["output"])
    if code == EXIT_OK:
        return {"outcome": "done", "exit_code": code, **figures}
    if code == EXIT_PARTIAL:
        continues = switch is not None and not switch["switched"] and p["switch_model"]
        if not continues or (figures.get("current") or {}).get("pending"):
            log.warning("partial: the budget ran out; the unsent chunks are pending in %s and the next "
                        "scheduled run sends them", p["output"])
        if continues and switch is not None:
            log.warning("partial: the switch to %s is not complete; the next scheduled run continues it",
                        switch["to"]["model"])
        return {"outcome": "partial", "exit_code": code, **figures}
    if code in (EXIT_USAGE, EXIT_DOES_NOT_FIT):
        raise AirflowFailException(f"pipeline run exited {code} before spending: see the log")
    raise AirflowException(f"pipeline run failed with exit code {code}; the unsent chunks are "
                           "pending and a retry sends them")


def _publish_target(p) -> tuple[str, dict[str, str]]:
    """(TARGET for `publish --to`, the child's environment): from the Connection when named,
    its password as PGPASSWORD only, never in the URL."""
    env = {k: v for k, v in os.environ.items() if k != "PGPASSWORD"}
    if not p["publish_conn_id"]:
        return p["publish_to"], env
    conn = BaseHook.get_connection(p["publish_conn_id"])
    user = f"{quote(conn.login, safe='')}@" if conn.login else ""
    port = f":{conn.port}" if conn.port else ""
    extra = conn.extra_dejson or {}
    query = f"?sslmode={quote(str(extra['sslmode']))}" if extra.get("sslmode") else ""
    if conn.password:
        env["PGPASSWORD"] = conn.password
    return f"postgresql://{user}{conn.host or ''}{port}/{quote(conn.schema or '', safe='')}{query}", env


@task(task_id="publish", execution_timeout=PUBLISH_TIMEOUT)
def publish() -> dict:
    p = get_current_context()["params"]
    if not p["publish_to"] and not p["publish_conn_id"]:
        raise AirflowSkipException("no database to publish to: set the param publish_to or publish_conn_id")
    target, env = _publish_target(p)
    cmd = [_python(), "-m", "pipeline", "publish", p["output"], "--to", target, "--table", p["publish_table"],
           "--json", *_runner_args(p)]
    if p["profile"]:
        cmd += ["--profile", p["profile"]]
    code, stdout = _stream(cmd, env)
    if code == EXIT_OK:
        try:
            report = json.loads(stdout)
        except json.JSONDecodeError:
            raise AirflowException("pipeline publish --json did not print one JSON object") from None
        log.info("published view %s to %s: %s rows, %s written; the view has %s pending and %s failed chunks "
                 "that the table does not", report["view"], report["table"], report["rows"], report["written"],
                 report["pending"], report["failed"])
        return {k: report[k] for k in ("table", "view", "model", "rows", "action", "written", "pending", "failed")}
    if code == EXIT_USAGE:
        raise AirflowFailException("pipeline publish: usage error (exit 2), see the log")
    raise AirflowException(f"pipeline publish failed with exit code {code}; the table serves what it did "
                           "and a retry completes it")


with DAG(
    dag_id=DAG_ID,
    description="Parquet corpus -> embeddings, budget-gated, kept current daily",
    doc_md=__doc__,
    schedule="@daily",
    start_date=pendulum.datetime(2025, 1, 1, tz="UTC"),
    catchup=False,      # a missed day is covered by the next run: --sync takes the corpus as it is
    max_active_runs=1,  # two runs on one output directory would race for one budget
    default_args={"retries": 2, "retry_delay": timedelta(minutes=10)},
    tags=["embedpipe"],
    params={
        "input": Param("/data/corpus/*.parquet", type="string", minLength=1,
                       description="Parquet glob (local, gs://, s3://)"),
        "output": Param("/data/embeddings", type="string", minLength=1,
                        description="output directory, the same every day: its current/ view is kept "
                                    "exactly the input"),
        "model": Param("text-embedding-3-small", type="string", minLength=1,
                       description="a model of configs/models.yaml"),
        "base_url": Param("http://127.0.0.1:8780/v1", type="string", minLength=1,
                          description="embeddings service base URL ending in /v1"),
        "max_spend_rub": Param(50.0, type=["null", "number"], minimum=0,
                               description="never spend more than this in one run (null: balance)"),
        "daily_cap_rub": Param(None, type=["null", "number"], minimum=0,
                               description="the account's spending in the service's day, all its "
                                           "clients included, stays under this (null: no cap)"),
        "monthly_cap_rub": Param(None, type=["null", "number"], minimum=0,
                                 description="the same for the service's last 31 days (null: no cap)"),
        "keep_columns": Param(None, type=["null", "string"],
                              description="input columns carried to every output row, comma-separated "
                                          "(--keep-columns); another list is adopted by the next run, "
                                          "every vector reused"),
        "chunk_tokens": Param(None, type=["null", "integer"], minimum=1,
                              description="the longest chunk in tokens (--chunk-tokens; null: the "
                                          "model's limit): output's chunking, kept from day to day; "
                                          "another one is a switch (switch_model)"),
        "allow_partial": Param(False, type="boolean",
                               description="when the estimate exceeds the budget, embed what fits "
                                           "and leave the rest pending for the next run"),
        "switch_model": Param(False, type="boolean",
                              description="when output serves another model: keep its current/ "
                                          "view in step in that model and build this model's view "
                                          "beside it, switching to it once complete"),
        "runner": Param("DirectRunner", enum=["DirectRunner", "DataflowRunner"]),
        "profile": Param(None, type=["null", "string"],
                         description="configs/profiles/NAME.yaml of run settings"),
        "dataflow_project": Param("my-gcp-project", type="string"),
        "dataflow_region": Param("europe-west1", type="string"),
        "dataflow_temp_location": Param("gs://my-bucket/embedpipe/tmp", type="string"),
        "api_key_secret": Param(None, type=["null", "string"],
                                description="secret manager version NAME the Dataflow workers "
                                            "read the key from (a reference, never the key)"),
        "publish_to": Param(None, type=["null", "string"],
                            description="after embed, a PostgreSQL table serves output's view: embedded, or "
                                        "postgresql://[user@]host[:port]/db without a password (null: no "
                                        "publish, unless publish_conn_id is set)"),
        "publish_conn_id": Param(None, type=["null", "string"],
                                 description="an Airflow Connection to publish to instead: host, port, login, "
                                             "schema (the database), password, extra sslmode"),
        "publish_table": Param("embeddings", type="string", minLength=1,
                               description="the table's name, optionally schema.table"),
    },
) as dag:
    plan_gate() >> embed() >> publish()
