"""Where the Prism a launcher starts listens (pipeline/prism.py): a binary that takes -job_host
(make prism's) is given --prism_host, 127.0.0.1 unless told otherwise, and dialed there; a binary
that does not is started as it is, unless --prism_host asks for an address it cannot take; make
prism's place holding a binary built without the patch is refused. Each mistake is one usage
error before anything is read. Prism itself: tests/prism/test_loopback.py."""
from __future__ import annotations

import os

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from pipeline import prism
from pipeline.exits import UsageError


def _binary(path, takes_host: bool) -> str:
    """A stand-in for Prism that answers -help with a usage that has -job_host, or not."""
    flag = "  -job_host string\n" if takes_host else ""
    path.write_text(f"#!/bin/sh\nprintf '%s' 'Usage of prism:\n{flag}  -job_port int\n' >&2\n")
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def patched(tmp_path):
    return _binary(tmp_path / "patched", True)


@pytest.fixture
def unpatched(tmp_path):
    return _binary(tmp_path / "unpatched", False)


def _options(*flags: str) -> PipelineOptions:
    return PipelineOptions(["--runner", "PrismRunner", *flags])


def _started(opts: PipelineOptions) -> tuple[list[str], str]:
    """The command line the launcher starts Prism with, after its own wrapper, and where it dials."""
    cmd, endpoint = prism._JobServer(opts).subprocess_cmd_and_endpoint()
    return cmd[cmd.index(str(os.getpid())) + 1:], endpoint


def test_a_prism_that_takes_an_address_gets_loopback_and_is_dialed_there(patched):
    cmd, endpoint = _started(_options("--prism_location", patched))
    port = cmd[cmd.index("--job_port") + 1]
    assert cmd[0] == patched and cmd[-1] == "--job_host=127.0.0.1" and endpoint == f"127.0.0.1:{port}"
    assert prism._JobServer.started == endpoint   # summary.json's


@pytest.mark.parametrize("host, dialed", [("127.0.0.2", "127.0.0.2"), ("::1", "[::1]"),
                                          ("0.0.0.0", "127.0.0.1"), ("::", "127.0.0.1")])
def test_prism_host_binds_elsewhere_and_the_launcher_dials_that(patched, host, dialed):
    opts = _options("--prism_location", patched, "--prism_host", host)
    prism.use_build(opts)
    cmd, endpoint = _started(opts)
    assert cmd[-1] == f"--job_host={host}" and endpoint == f"{dialed}:{cmd[cmd.index('--job_port') + 1]}"


def test_a_prism_of_one_s_own_without_the_flag_runs_as_it_is(unpatched):
    opts = _options("--prism_location", unpatched)
    prism.use_build(opts)
    cmd, endpoint = _started(opts)
    assert not any(a.startswith("--job_host") for a in cmd) and endpoint.startswith("localhost:")   # as Beam's


def test_an_address_for_a_prism_that_takes_none_is_a_usage_error(unpatched):
    with pytest.raises(UsageError, match=r"--prism_host 127\.0\.0\.1: the Prism at .* takes no address"):
        prism.use_build(_options("--prism_location", unpatched, "--prism_host", "127.0.0.1"))


def test_make_prism_s_binary_built_without_the_patch_is_refused(tmp_path, monkeypatch):
    stale = tmp_path / "v0" / "prism"
    stale.parent.mkdir()
    _binary(stale, False)
    monkeypatch.setattr(prism, "build_path", lambda root, version="0": str(stale))
    with pytest.raises(UsageError, match=r"built without tools/prism-bind\.patch .*: run `make prism`"):
        prism.use_build(_options())
    _binary(stale, True)
    prism.takes_host.cache_clear()
    opts = _options()
    prism.use_build(opts)
    assert opts.get_all_options()["prism_location"] == str(stale)


@pytest.mark.parametrize("host, said", [
    ("localhost", "not an IP address"),   # a name: the launcher and Prism could resolve it apart
    ("", "not an IP address"),
    ("192.0.2.1", "Prism cannot listen there"),   # TEST-NET-1: no address of this machine
])
def test_an_address_prism_cannot_take_is_a_usage_error(patched, host, said):
    with pytest.raises(UsageError, match=said):
        prism.use_build(_options("--prism_location", patched, "--prism_host", host))


def test_prism_host_with_a_job_service_of_one_s_own_is_a_usage_error():
    with pytest.raises(UsageError, match="with --job_endpoint the launcher starts no Prism"):
        prism.use_build(_options("--job_endpoint", "localhost:8073", "--prism_host", "127.0.0.1"))
