"""An input file rewritten while a run reads it, and a corrupt one: named in one line, exit 1
(2 when found before anything is sent), nothing served mixed, nothing paid twice afterwards.

The rewrite lands at an exact point of the run (after the scan, after the job) by wrapping the
driver's own step there: the files, the job, the sandbox and the commit are all real. The soak
test (tests/soak/test_input_rewrite_soak.py) rewrites files while a slowed run reads them.
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.checks import reading
from pipeline.checks.inputs import inspect_input
from pipeline.cli import WORKER_FAILURES, main
from pipeline.commands import run as run_command
from tests.conftest import SANDBOX_KEY
from tests.e2e.money_helpers import (MODEL, REPO, assert_every_row_once, billed_twice, corpus_rows, current, ledger,
                                     run, start_sandbox, write_models)
from transforms.read import stamps
from transforms.read.parquet import read_row_group

SCHEMA = pa.schema([("id", pa.string()), ("text", pa.string())])


def write(path, rows, row_group_size=None, checksums=False, **options):
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path, row_group_size=row_group_size,
                   write_page_checksum=checksums, **options)
    return path


def rewritten(rows):
    """Day two's corpus: a third of the texts edited, 20 documents gone, 20 new."""
    out = [dict(r, text=r["text"] + " (edited)") if i % 3 == 0 else r for i, r in enumerate(rows[20:])]
    return out + [{"id": f"new-{i}", "text": f"a new document number {i} about rivers"} for i in range(20)]


def one_error_line(caplog, capfd) -> str:
    """The one error the command logged (Beam's own record of the worker's failure shows with
    --verbose only), with no traceback anywhere."""
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR and r.name != WORKER_FAILURES]
    caplog.clear()
    err = capfd.readouterr().err
    assert len(errors) == 1 and not errors[0].exc_info and "Traceback" not in err, (errors, err)
    return errors[0].getMessage()


def cli(*argv: str) -> tuple[int, str]:
    """The command as a user runs it: (exit code, stderr)."""
    proc = subprocess.run([sys.executable, "-m", "pipeline", *argv], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "EMBEDDINGS_API_KEY": SANDBOX_KEY}, timeout=300)
    return proc.returncode, proc.stderr


def stderr_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip() and " INFO " not in line]
    assert len(lines) == 1 and " ERROR " in lines[0], stderr
    return lines[0]


@pytest.fixture
def setup(tmp_path, sandbox_factory, monkeypatch):
    monkeypatch.setenv("EMBEDDINGS_API_KEY", "sk-test-key")
    models = write_models(tmp_path / "models.yaml")
    return models, start_sandbox(sandbox_factory, models)


def after(monkeypatch, name: str, action):
    """Run ACTION once the driver's step NAME (of pipeline/commands/run.py) has returned."""
    real = getattr(run_command, name)

    def wrapped(*args, **kwargs):
        result = real(*args, **kwargs)
        action()
        return result
    monkeypatch.setattr(run_command, name, wrapped)


@pytest.mark.parametrize("how", ["in_place", "rename"])
def test_a_file_rewritten_after_the_job_read_it_is_never_committed(tmp_path, setup, monkeypatch, caplog, capfd,
                                                                    how):
    models, sandbox = setup
    corpus, out = tmp_path / "corpus.parquet", tmp_path / "out"
    old = corpus_rows(n_short=60, n_long=1)
    assert run(write(corpus, old), out, sandbox, models, "--sync") == 0
    served = current(out, "embeddings").sort_by([("doc_id", "ascending"), ("chunk_index", "ascending")])
    new = rewritten(old)

    def rewrite():
        if how == "in_place":
            write(corpus, new)
        else:
            os.replace(write(tmp_path / "next.parquet", new), corpus)
    after(monkeypatch, "_run_job", rewrite)
    caplog.clear()
    capfd.readouterr()
    assert run(corpus, out, sandbox, models, "--sync") == 1
    line = one_error_line(caplog, capfd)
    assert f"the input file {corpus} changed while the run read it" in line and "nothing is committed" in line
    assert line.endswith(": nothing answered is paid twice.")   # an attempt that timed out may have been billed
    assert current(out, "embeddings").sort_by([("doc_id", "ascending"), ("chunk_index", "ascending")]) == served
    paid = len(ledger(sandbox))
    assert paid > 1   # the job sent the day's changes before the rewrite was found

    monkeypatch.undo()
    monkeypatch.setenv("EMBEDDINGS_API_KEY", "sk-test-key")
    assert run(corpus, out, sandbox, models, "--sync") == 0
    assert_every_row_once(out, new)
    assert not billed_twice(ledger(sandbox))


def test_a_file_changed_between_the_scan_and_the_open_stops_before_anything_is_sent(tmp_path, setup, monkeypatch,
                                                                                   caplog, capfd):
    """A smaller replacement (one row group where the scan saw 16) is named, never read with the
    old file's row group indices."""
    models, sandbox = setup
    corpus, out = tmp_path / "corpus.parquet", tmp_path / "out"
    rows = corpus_rows(n_short=160, n_long=0)
    write(corpus, rows, row_group_size=10)
    after(monkeypatch, "scan_input", lambda: write(corpus, rows[:5]))
    caplog.clear()
    capfd.readouterr()
    assert run(corpus, out, sandbox, models) == 1
    line = one_error_line(caplog, capfd)
    assert f"the input file {corpus} changed while the run read it" in line
    assert not ledger(sandbox) and not (out / "current").exists()


def test_a_row_group_of_a_smaller_replacement_is_an_input_change_not_an_index_error(tmp_path):
    corpus = write(tmp_path / "corpus.parquet", corpus_rows(n_short=160, n_long=0), row_group_size=10)
    info = inspect_input(str(corpus), "id", "text", [])
    write(corpus, corpus_rows(n_short=5, n_long=0))
    with pytest.raises(stamps.InputChanged, match="bytes when listed"):
        list(read_row_group((str(corpus), 15, {}), ["id", "text"], stamps=info.stamp_map))
    assert reading.changed(info).path == str(corpus)
    corpus.unlink()
    assert stamps.change(str(corpus), info.stamps[0]) == "it is gone"


def corrupt(path, row_group: int, column: int) -> None:
    """Flip bytes of the last data page of a column chunk of PATH: its last bytes are the page's
    values (its header, before them, holds statistics no read uses)."""
    chunk = pq.ParquetFile(path).metadata.row_group(row_group).column(column)
    end = (chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset) \
        + chunk.total_compressed_size
    start = end - 12
    data = bytearray(path.read_bytes())
    for i in range(start, start + 8):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))


def test_a_corrupt_text_page_is_named_by_the_run_and_by_plan_before_sending(tmp_path, setup):
    """Plain uncompressed texts: without the page's checksum, flipped bytes would be read as text."""
    models, sandbox = setup
    corpus, out = tmp_path / "corpus.parquet", tmp_path / "out"
    write(corpus, corpus_rows(n_short=200, n_long=0), row_group_size=20, checksums=True, compression="none",
          use_dictionary=False)
    corrupt(corpus, 6, 1)
    base = ["--input", str(corpus), "--model", MODEL, "--base-url", sandbox.base_url, "--models-config", str(models)]
    code, err = cli("plan", *base)
    line = stderr_line(err)
    assert code == 2, err
    assert f"the input file {corpus} is not readable Parquet (row group 6: " in line and "nothing was sent" in line
    assert not ledger(sandbox)
    code, err = cli("run", *base, "--output", str(out))
    line = stderr_line(err)
    assert code == 1, err
    assert f"the input file {corpus} is not readable Parquet (row group 6: " in line and "nothing is committed" in line
    assert not (out / "current").exists()


def test_a_corrupt_id_page_is_found_before_anything_is_paid(tmp_path, setup):
    """Snappy pages: the scan's read of the ids fails on the corrupt one, checksum or not."""
    models, sandbox = setup
    corpus, out = tmp_path / "corpus.parquet", tmp_path / "out"
    write(corpus, corpus_rows(n_short=200, n_long=0), row_group_size=20, checksums=True)
    corrupt(corpus, 3, 0)
    code, err = cli("run", "--input", str(corpus), "--output", str(out), "--model", MODEL,
                    "--base-url", sandbox.base_url, "--models-config", str(models))
    line = stderr_line(err)
    assert code == 2, err
    assert f"{corpus}: not a readable Parquet file (" in line and "nothing was sent" in line
    assert not ledger(sandbox)


@pytest.fixture
def s3(monkeypatch):
    from tests.e2e.test_object_stores import S3
    store = S3(monkeypatch)
    yield store
    store.stop()


def test_an_object_rewritten_on_s3_is_found_by_its_etag_and_never_committed(tmp_path, setup, s3, monkeypatch,
                                                                            caplog, capfd):
    from tests.e2e.test_object_stores import BUCKET, mirror
    models, sandbox = setup
    old = corpus_rows(n_short=40, n_long=0)
    new = rewritten(old)
    corpus, output = s3.put(write(tmp_path / "old.parquet", old), "in/c.parquet"), f"s3://{BUCKET}/out"

    def run_s3(*extra: str) -> int:
        return main(["run", "--input", corpus, "--output", output, "--model", MODEL, "--base-url", sandbox.base_url,
                     "--models-config", str(models), "--sync", *s3.flags, *extra])
    assert run_s3() == 0
    info = inspect_input(corpus, "id", "text", [])
    assert info.stamps[0].checksum == s3.client.head_object(Bucket=BUCKET, Key="in/c.parquet")["ETag"]
    manifest = s3.client.get_object(Bucket=BUCKET, Key="out/_current.json")["Body"].read()

    same_size = bytearray((tmp_path / "old.parquet").read_bytes())
    same_size[len(same_size) // 2] ^= 1
    (tmp_path / "same.parquet").write_bytes(bytes(same_size))
    s3.put(tmp_path / "same.parquet", "in/c.parquet")   # within S3's second, often: only the ETag tells
    assert stamps.change(corpus, info.stamps[0]) in ("modified since it was listed", f"checksum {info.stamps[0][2]} "
                                                     f"when listed, {stamps.stamp(corpus).checksum} now")

    s3.put(write(tmp_path / "old.parquet", old), "in/c.parquet")
    after(monkeypatch, "_run_job", lambda: s3.put(write(tmp_path / "new.parquet", new), "in/c.parquet"))
    caplog.clear()
    capfd.readouterr()
    assert run_s3() == 1
    assert f"the input file {corpus} changed while the run read it" in one_error_line(caplog, capfd)
    assert s3.client.get_object(Bucket=BUCKET, Key="out/_current.json")["Body"].read() == manifest

    monkeypatch.undo()
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
        monkeypatch.setenv(name, value)
    assert run_s3() == 0
    assert_every_row_once(mirror(s3, "out/", tmp_path / "out"), new)
    assert not billed_twice(ledger(sandbox))
