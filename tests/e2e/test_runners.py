"""The same job on other runners gives the same outputs, and the runner profiles parse.

Portable runs go through a real job service (`local_job_service_main`) in a subprocess; the
EXTERNAL one also through a real worker pool (`worker_pool_main`), whose SDK workers are
separate processes that get the API key only from their own environment, as cluster workers
do. Every run is compared with a DirectRunner run of the same corpus against the same sandbox.

What is compared: rows, chunk boundaries, text hashes, vectors, failures, the tokens sent, and
that each run reconciles exactly with the sandbox's ledger. Per-row costs are compared exactly
only when both runs packed the same requests: runners bundle differently, so the packer (per
bundle) can cut other requests, and the service rounds each request's cost to 1e-6 RUB. What
does not depend on packing is checked instead: each text's share of its request is within
1.5e-6 RUB of its tokens x price (request rounding <= 0.5e-6 + apportioning < 1e-6).
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import pstats
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import apache_beam as beam
import numpy as np
import pytest

from pipeline.settings import profiles
from pipeline.settings.options import EmbedPipeOptions
from service.catalog import load_models
from service.sandbox.launcher import SandboxProcess
from tests.conftest import SANDBOX_KEY, free_port
from tests.e2e.helpers import corpus_rows, ledger, read_kind, run, summary, write_corpus
from tools.pool import listening

MODEL = "text-embedding-3-small"
START_TIMEOUT_S = 60.0
REPO = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- profiles

def _options(*argv: str) -> EmbedPipeOptions:
    return EmbedPipeOptions(profiles.expand(list(argv)))


@pytest.mark.parametrize("name, runner", [("local", "DirectRunner"), ("dataflow", "DataflowRunner"),
                                          ("flink", "FlinkRunner"), ("prism", "PrismRunner"),
                                          ("prism-pool", "PrismRunner")])
def test_profile_parses_and_the_command_line_wins(name, runner):
    from apache_beam.options.pipeline_options import StandardOptions
    opts = _options("--profile", name)
    assert opts.view_as(StandardOptions).runner == runner
    assert opts.max_in_flight >= 1
    over = _options("--profile", name, "--max-in-flight", "7", "--runner", "PortableRunner")
    assert over.max_in_flight == 7
    assert over.view_as(StandardOptions).runner == "PortableRunner"


def test_dataflow_profile_passes_beams_validation():
    from apache_beam.options.pipeline_options import GoogleCloudOptions, SetupOptions, WorkerOptions
    from apache_beam.options.pipeline_options_validator import PipelineOptionsValidator
    from apache_beam.runners.dataflow.dataflow_runner import DataflowRunner
    opts = _options("--profile", "dataflow", "--region", "us-central1")
    assert PipelineOptionsValidator(opts, DataflowRunner()).validate() == []
    assert opts.view_as(GoogleCloudOptions).region == "us-central1"  # overridden
    assert opts.view_as(GoogleCloudOptions).project == "my-project"
    assert opts.view_as(SetupOptions).setup_file == "./setup.py"
    assert (REPO / opts.view_as(SetupOptions).setup_file).is_file()
    assert opts.view_as(WorkerOptions).max_num_workers == 3
    # the validator is not a rubber stamp: a local temp_location is refused
    bad = _options("--profile", "dataflow", "--temp_location", "/tmp/x", "--staging_location", "/tmp/y")
    assert PipelineOptionsValidator(bad, DataflowRunner()).validate()


def test_prism_without_a_build_is_a_usage_error_naming_make_prism(tmp_path, monkeypatch, caplog):
    """Beam would download Prism from GitHub at submit time: offline, its traceback after the scan."""
    from pipeline import prism
    monkeypatch.setattr(prism, "build_path", lambda root, version="0": str(tmp_path / "none" / "prism"))
    code = run("--profile", "prism", "--input", str(tmp_path / "x.parquet"), "--output", str(tmp_path / "out"),
               "--model", MODEL, "--base-url", "http://127.0.0.1:9/v1")
    assert code == 2 and "run `make prism`" in caplog.text and "--prism_location" in caplog.text
    assert not (tmp_path / "out").exists()


def test_flink_profile_uses_a_prestaged_job_server_jar(tmp_path):
    from apache_beam.options.pipeline_options import FlinkRunnerOptions, PortableOptions
    from apache_beam.options.pipeline_options_validator import PipelineOptionsValidator
    from apache_beam.runners.portability.flink_runner import FlinkJarJobServer, FlinkRunner
    opts = _options("--profile", "flink")
    assert PipelineOptionsValidator(opts, FlinkRunner()).validate() == []
    flink = opts.view_as(FlinkRunnerOptions)
    assert flink.flink_version == "1.19" and flink.parallelism == 6
    assert opts.view_as(PortableOptions).environment_type == "EXTERNAL"
    # without a jar Beam would download this URL, of the installed apache-beam's version; the
    # profile's comment and docs/RUNNERS.md name the same one with the version left to the reader,
    # so that neither goes stale when the lock moves to another Beam
    url = FlinkJarJobServer(opts).path_to_jar()
    assert url.startswith("https://repo.maven.apache.org/") and url.endswith(f"-{beam.__version__}.jar")
    profile = (REPO / "configs" / "profiles" / "flink.yaml").read_text()
    assert url in profile.replace("<beam version>", beam.__version__)
    runners = (REPO / "docs" / "RUNNERS.md").read_text()
    assert url in runners.replace("$JAR", "beam-runners-flink-1.19-job-server-$BEAM.jar").replace("$BEAM", beam.__version__)
    assert not re.search(r"\b2\.\d+\.\d+\b", profile)   # no Beam version written in the profile
    jar = tmp_path / Path(url).name
    jar.write_bytes(b"PK")  # only its existence matters: Beam then neither downloads nor caches
    staged = _options("--profile", "flink", "--flink_job_server_jar", str(jar))
    assert FlinkJarJobServer(staged).path_to_jar() == str(jar)
    assert FlinkJarJobServer.local_jar(str(jar)) == str(jar)


# ---------------------------------------------------------------- runs

@dataclasses.dataclass
class Outcome:
    code: int
    rows: dict          # (doc_id, chunk_index) -> row dict (embedding as bytes)
    failed: list
    requests: list
    charges: list       # this run's ledger entries
    summary: dict


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """One sandbox, one corpus and the API key for the module; runs share them (the balance is
    ample) and are told apart by their request ids."""
    tmp = tmp_path_factory.mktemp("runners")
    with pytest.MonkeyPatch.context() as mp, \
            SandboxProcess(tmp / "sandbox.db", key=SANDBOX_KEY, balance=1000.0) as sandbox:
        mp.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
        yield {"tmp": tmp, "sandbox": sandbox, "corpus": write_corpus(tmp / "corpus.parquet")}


def run_job(env, name: str, *extra: str) -> Outcome:
    out = env["tmp"] / name
    started = time.monotonic()
    code = run("--input", str(env["corpus"]), "--output", str(out), "--model", MODEL,
               "--base-url", env["sandbox"].base_url, "--keep-columns", "lang", *extra)
    print(f"{name}: exit {code} in {time.monotonic() - started:.1f} s")
    emb, failed, req = (read_kind(out, k) for k in ("embeddings", "failed", "requests"))
    assert read_kind(out, "pending") is None or read_kind(out, "pending").num_rows == 0
    rows = {(r["doc_id"], r["chunk_index"]): {**r, "embedding": np.asarray(r["embedding"], np.float32).tobytes()}
            for r in emb.to_pylist()}
    ids = set(req.column("request_id").to_pylist())
    charges = [c for c in ledger(env["sandbox"].db) if c["request_id"] in ids]
    failures = sorted((r["doc_id"] or "", -1 if r["chunk_index"] is None else r["chunk_index"], r["reason"])
                      for r in failed.to_pylist())
    return Outcome(code, rows, failures,
                   req.to_pylist(), charges, summary(out))


@pytest.fixture(scope="module")
def reference(env) -> Outcome:
    """The DirectRunner with default options (pipeline/commands/run.py runs it as an FnApiRunner)."""
    return run_job(env, "direct-default")


def micro(rub: float) -> int:
    return round(rub * 1_000_000)


def assert_reconciles(o: Outcome) -> None:
    """Rows, requests and the service's own ledger agree to the micro-rouble; each distinct
    text was sent exactly once."""
    assert o.code == 0
    rows_micro = sum(micro(r["cost_rub"]) for r in o.rows.values())
    assert rows_micro == sum(micro(r["cost_rub"]) for r in o.requests) == sum(micro(c["cost_rub"]) for c in o.charges)
    assert len(o.charges) == len(o.requests)
    sent = collections.Counter(h for c in o.charges for h in c["input_sha256"])
    assert set(sent) == {r["text_sha256"] for r in o.rows.values()} and max(sent.values()) == 1
    assert o.summary["reconciliation"]["rows_minus_requests_rub"] == 0


def text_shares(o: Outcome) -> dict[str, int]:
    shares = collections.Counter()
    for r in o.rows.values():
        shares[r["text_sha256"]] += micro(r["cost_rub"])
    return dict(shares)


def assert_same_outputs(ref: Outcome, other: Outcome) -> None:
    assert_reconciles(ref)
    assert_reconciles(other)
    assert other.rows.keys() == ref.rows.keys()
    same = ("chunk_count", "token_start", "token_end", "n_tokens", "text_sha256", "model", "lang", "embedding")
    for key, row in ref.rows.items():
        assert {k: other.rows[key][k] for k in same} == {k: row[k] for k in same}, key
    assert other.failed == ref.failed
    for field in ("prompt_tokens", "n_inputs"):
        assert sum(r[field] for r in other.requests) == sum(r[field] for r in ref.requests)
    for field in ("documents", "chunks", "embedded", "failed", "pending", "prompt_tokens"):
        assert other.summary[field] == ref.summary[field], field

    price_micro = load_models()[MODEL].price_per_token * 1_000_000
    tokens = {r["text_sha256"]: r["n_tokens"] for r in ref.rows.values()}
    for o in (ref, other):
        for sha, share in text_shares(o).items():
            assert abs(share - tokens[sha] * price_micro) < 1.5, sha
    packing = lambda o: sorted(tuple(c["input_sha256"]) for c in o.charges)
    print(f"requests: {len(ref.charges)} vs {len(other.charges)}, "
          f"{'same' if packing(other) == packing(ref) else 'different'} packing")
    if packing(other) == packing(ref):
        assert text_shares(other) == text_shares(ref)
        assert [micro(c["cost_rub"]) for c in sorted(other.charges, key=lambda c: c["input_sha256"])] == \
            [micro(c["cost_rub"]) for c in sorted(ref.charges, key=lambda c: c["input_sha256"])]
    else:  # each request is rounded to 1e-6 RUB on its own
        slack = (len(ref.charges) + len(other.charges)) / 2
        assert abs(sum(text_shares(other).values()) - sum(text_shares(ref).values())) <= slack


def test_reference_run_is_complete(reference):
    assert_reconciles(reference)
    assert reference.summary["runner"] == {"name": "DirectRunner", "runs_as": "FnApiRunner",
                                           "running_mode": "in_memory", "workers": 1}
    good = {r["id"] for r in corpus_rows() if r["id"] and r["text"] and r["text"].strip() and r["id"] != "twice"}
    assert {doc for doc, _ in reference.rows} == good


def test_direct_one_worker_and_two_threads_agree(env, reference):
    one = run_job(env, "direct-1-thread", "--direct_num_workers", "1", "--direct_running_mode", "multi_threading")
    two = run_job(env, "direct-2-threads", "--direct_num_workers", "2", "--direct_running_mode", "multi_threading")
    assert_same_outputs(reference, one)
    assert_same_outputs(reference, two)


def test_direct_two_processes_agree(env, reference):
    two = run_job(env, "direct-2-processes", "--direct_num_workers", "2", "--direct_running_mode", "multi_processing")
    assert_same_outputs(reference, two)
    assert two.summary["runner"] == {"name": "DirectRunner", "runs_as": "FnApiRunner",
                                     "running_mode": "multi_processing", "workers": 2}


class _ReportFileSystemOptions(beam.DoFn):
    """Where a worker's FileSystems would send an s3:// path: from the options its process has."""

    def __init__(self, where: str):
        self._where = where

    def process(self, _):
        from apache_beam.io.filesystems import FileSystems
        from apache_beam.options.pipeline_options import S3Options
        options = FileSystems._pipeline_options
        endpoint = options.view_as(S3Options).s3_endpoint_url if options is not None else None
        Path(self._where, f"{os.getpid()}.txt").write_text(str(endpoint))
        yield endpoint


def test_worker_processes_have_the_jobs_filesystem_options(tmp_path):
    """A worker process sets its FileSystems from the options the runner provides: without the
    job's, an s3:// input went to AWS's endpoint instead of --s3_endpoint_url."""
    from pipeline.runner import make_runner
    opts = _options("--direct_num_workers", "2", "--direct_running_mode", "multi_processing",
                    "--s3_endpoint_url", "http://127.0.0.1:9")
    with beam.Pipeline(runner=make_runner(opts), options=opts) as p:
        _ = p | beam.Create(range(4)) | beam.Reshuffle() | beam.ParDo(_ReportFileSystemOptions(str(tmp_path)))
    reports = {int(f.stem): f.read_text() for f in tmp_path.glob("*.txt")}
    assert reports and os.getpid() not in reports
    assert set(reports.values()) == {"http://127.0.0.1:9"}


def test_worker_processes_profile_when_asked(env, tmp_path):
    """--profile_cpu reaches the local runner's worker processes: each writes the profile of the
    bundles it ran, which is where the job's own work is (the driver's profile shows it waiting)."""
    where = tmp_path / "profiles"
    outcome = run_job(env, "direct-2-processes-profiled", "--direct_num_workers", "2",
                      "--direct_running_mode", "multi_processing", "--profile_cpu", "--profile_location", str(where))
    assert outcome.code == 0
    workers = [p for p in (where / "cpu_profile").iterdir() if not p.name.startswith("direct-")]
    assert workers, "no profile from a worker process"
    functions = {path for p in workers for (path, _, _) in pstats.Stats(str(p)).stats}
    assert any(path.endswith("transforms/read/split.py") for path in functions)


# ---------------------------------------------------------------- portable

def _wait_for(condition, what: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not condition():
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}: {log.read_text()[-2000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not ready after {START_TIMEOUT_S:.0f} s: {log.read_text()[-2000:]}")
        time.sleep(0.1)


class _Services:
    """Beam services as subprocesses, each in its own process group so that teardown also ends
    the SDK workers a worker pool started."""

    def __init__(self, tmp: Path):
        self.tmp, self.procs = tmp, []

    def _start(self, args: list[str], name: str, env: dict) -> tuple[subprocess.Popen, Path]:
        log = self.tmp / f"{name}.log"
        with open(log, "wb") as fh:
            proc = subprocess.Popen([sys.executable, "-m", *args], stdout=fh, stderr=subprocess.STDOUT,
                                    cwd=self.tmp, env=env, start_new_session=True)
        self.procs.append(proc)
        return proc, log

    def job_service(self) -> str:
        port_file = self.tmp / "job_service.port"
        proc, log = self._start(["apache_beam.runners.portability.local_job_service_main", "--port", "0",
                                 "--port_file", str(port_file)], "job_service", dict(os.environ))
        _wait_for(port_file.exists, "the job service", proc, log)
        return f"localhost:{port_file.read_text().strip()}"

    def worker_pool(self, env: dict) -> str:
        port = free_port()
        proc, log = self._start(["apache_beam.runners.worker.worker_pool_main", "--service_port", str(port)],
                                "worker_pool", env)
        _wait_for(lambda: listening(port), "the worker pool", proc, log)
        return f"localhost:{port}"

    def stop(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


@pytest.fixture(scope="module")
def job_endpoint(tmp_path_factory):
    """One job service for the module's portable runs: it keeps no state between jobs."""
    services = _Services(tmp_path_factory.mktemp("job_service"))
    try:
        yield services.job_service()
    finally:
        services.stop()


@pytest.fixture
def worker_pool(tmp_path):
    services = _Services(tmp_path)
    yield services.worker_pool
    services.stop()


def test_portable_runner_loopback_agrees(env, reference, job_endpoint):
    assert_same_outputs(reference, run_job(env, "portable-loopback", "--runner", "PortableRunner",
                                           "--job_endpoint", job_endpoint, "--environment_type", "LOOPBACK"))


def _worker_env(with_key: bool) -> dict:
    """What a cluster's SDK workers see: their own environment, not the launcher's. The pool
    starts its workers as `python -c ...` from PATH, so this venv's python comes first."""
    worker = {k: v for k, v in os.environ.items() if k != "EMBEDDINGS_API_KEY"}
    worker["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    if with_key:
        worker["EMBEDDINGS_API_KEY"] = SANDBOX_KEY
    return worker


def test_portable_runner_external_worker_pool_agrees(env, reference, job_endpoint, worker_pool):
    pool = worker_pool(_worker_env(with_key=True))
    external = run_job(env, "portable-external", "--runner", "PortableRunner", "--job_endpoint", job_endpoint,
                       "--environment_type", "EXTERNAL", "--environment_config", pool)
    assert_same_outputs(reference, external)
    assert external.summary["runner"] == {"name": "PortableRunner", "environment_type": "EXTERNAL",
                                          "job_endpoint": job_endpoint, "worker_pool": pool}



def test_external_workers_without_the_key_spend_nothing_and_exit_1(env, job_endpoint, worker_pool, tmp_path):
    """The key is read on the worker (service/credentials.py KeySource), never shipped in the job:
    workers whose environment lacks it fail in setup, before any request."""
    pool = worker_pool(_worker_env(with_key=False))
    before = len(ledger(env["sandbox"].db))
    try:
        code = run("--input", str(env["corpus"]), "--output", str(tmp_path / "no-key"), "--model", MODEL,
                   "--base-url", env["sandbox"].base_url, "--runner", "PortableRunner", "--job_endpoint",
                   job_endpoint, "--environment_type", "EXTERNAL", "--environment_config", pool)
    finally:
        assert len(ledger(env["sandbox"].db)) == before
    assert code == 1


def _prestaged_flink_jar() -> str | None:
    """$EMBEDPIPE_FLINK_JOB_SERVER_JAR, or the jar the flink profile names in Beam's jar cache."""
    from apache_beam.runners.portability.flink_runner import FlinkJarJobServer
    from apache_beam.utils.subprocess_server import JavaJarServer
    if os.environ.get("EMBEDPIPE_FLINK_JOB_SERVER_JAR"):
        return os.environ["EMBEDPIPE_FLINK_JOB_SERVER_JAR"]
    cached = Path(JavaJarServer.JAR_CACHE) / Path(FlinkJarJobServer(_options("--profile", "flink")).path_to_jar()).name
    return str(cached) if cached.is_file() else None


@pytest.mark.soak
@pytest.mark.skipif(_prestaged_flink_jar() is None or shutil.which("java") is None,
                    reason="needs java and a pre-staged Flink job-server jar (docs/RUNNERS.md); "
                           "nothing is downloaded by the tests")
def test_flink_runner_on_an_embedded_cluster_agrees(env, reference):
    """FlinkRunner with flink_master [local]: the job server starts an in-JVM Flink cluster."""
    from apache_beam.options.pipeline_options import FlinkRunnerOptions
    version = _options("--profile", "flink").view_as(FlinkRunnerOptions).flink_version
    assert_same_outputs(reference, run_job(env, "flink-local", "--runner", "FlinkRunner", "--flink_master", "[local]",
                                           "--flink_version", version, "--flink_job_server_jar", _prestaged_flink_jar(),
                                           "--environment_type", "LOOPBACK", "--parallelism", "2"))


@pytest.mark.parametrize("flag", ["--input", "--output", "--known"])
def test_dataflow_refuses_a_local_path_before_spending(tmp_path, sandbox, monkeypatch, caplog, flag):
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
    local = str(tmp_path / "here")
    paths = {"--input": "gs://bucket/corpus/*.parquet", "--output": "gs://bucket/out", "--known": None}
    paths[flag] = local
    argv = ["--profile", "dataflow", "--region", "us-central1", "--model", MODEL, "--base-url", sandbox.base_url]
    argv += [a for f, p in paths.items() if p for a in (f, p)]
    assert run(*argv) == 2
    errors_logged = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors_logged) == 1 and not errors_logged[0].exc_info
    assert errors_logged[0].getMessage().startswith(f"{flag} {local} is on this machine's disk")
    assert ledger(sandbox.db) == []
