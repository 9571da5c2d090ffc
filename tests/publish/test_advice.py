"""The commands a publish prints as what to do next work when run as printed, through a shell: a
DIR with a space, a URL with `&`, the run's --run-config and --profile, a view of non-default
length."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import uuid

import psycopg
from psycopg import sql

from tests.e2e.money_helpers import REPO, corpus_rows, run, start_sandbox, write_corpus, write_models
from tests.postgres import url_of
from tests.publish.helpers import assert_same, summary
from tests.publish.test_publish import _ef_search


def shell(command: str) -> subprocess.CompletedProcess:
    """COMMAND as printed, run by a shell whose `python` is this venv's (as an activated one)."""
    path = f"{os.path.dirname(sys.executable)}:{os.environ.get('PATH', '')}"
    return subprocess.run(command, shell=True, cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PATH": path})


def test_a_failed_publish_after_a_run_prints_the_publish_that_works(tmp_path, sandbox_factory, env_key, pg_server,
                                                                     caplog):
    models = write_models(tmp_path / "models.yaml")
    config = tmp_path / "my settings.yaml"
    config.write_text("publish:\n  ef_search: 77\n")
    out = tmp_path / "my out"
    database = f"t_{uuid.uuid4().hex[:12]}"   # not there yet: the publish fails
    url = f"{url_of(pg_server, database)}&connect_timeout=10"
    corpus = write_corpus(tmp_path / "corpus.parquet", corpus_rows(n_short=20, n_long=1))
    assert run(corpus, out, start_sandbox(sandbox_factory, models), models, "--run-config", str(config),
               "--profile", "local", "--publish", url) == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "is committed" in errors[0], errors
    command = errors[0].rsplit("Publish it with: ", 1)[1]
    assert summary(out)["publish"]["command"] == command
    with psycopg.connect(url_of(pg_server, "postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    try:
        done = shell(command)
        assert done.returncode == 0, done.stderr[-3000:]
        assert_same(out, url)
        assert _ef_search(url) == "77"   # the run's --run-config, carried
    finally:
        with psycopg.connect(url_of(pg_server, "postgres"), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(database)))


def test_the_pending_chunks_advice_embeds_and_publishes_them(tmp_path, sandbox_factory, env_key, pg_url, capsys):
    """A budget-stopped day of a view of 16 dimensions (the model's are 32) is published; the
    command it prints for the pending chunks embeds them and publishes them."""
    models = write_models(tmp_path / "models.yaml")
    out = tmp_path / "my out"
    corpus = write_corpus(tmp_path / "corpus.parquet", corpus_rows(n_short=40, n_long=2))
    code = run(corpus, out, start_sandbox(sandbox_factory, models), models, "--dimensions", "16", "--allow-partial",
               "--max-spend-rub", "0.05", "--publish", f"{pg_url}&connect_timeout=10")
    assert code == 4 and summary(out)["current"]["pending"] > 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("the view also has"))
    command = line.split("`")[1]
    assert line.endswith("` publishes them") and "--dimensions 16" in command
    done = shell(command)
    assert done.returncode == 0, done.stderr[-3000:]
    assert summary(out)["current"]["pending"] == 0 and summary(out)["publish"]["pending"] == 0
    assert_same(out, pg_url)
