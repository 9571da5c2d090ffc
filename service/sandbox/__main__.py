"""`python -m service.sandbox [flags]` serves; `python -m service.sandbox ledger --db PATH`
prints the ledger, one JSON object per charge per line."""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sqlite3
import sys
import threading
from types import FrameType

from service.catalog import ConfigError

from .config import SandboxConfig, build_parser, config_from_args
from .server import SandboxServer, make_server
from .store import read_ledger

log = logging.getLogger("service.sandbox")


def _write_ready_file(path: str, port: int) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"port": port, "pid": os.getpid()}, fh)
    os.replace(tmp, path)   # readers never see a half-written file


def _configured(argv: list[str]) -> tuple[argparse.Namespace, SandboxConfig]:
    args = build_parser().parse_args(argv)
    logging.getLogger().setLevel(args.log_level)
    return args, config_from_args(args)


def _serving(config: SandboxConfig, port: int) -> None:
    keys = ", ".join(f"{k.key_id}@{k.account}" for k in config.keys)   # fingerprints only
    log.info("serving http://%s:%d/v1 (db %s, keys %s, precheck %s, capacity %s (%s), faults %s)", config.host,
             port, config.db, keys, config.precheck, config.capacity or "unlimited", config.capacity_mode,
             config.faults)
    if config.ready_file:
        _write_ready_file(config.ready_file, port)


_START_ERRORS = (ConfigError, OSError, sqlite3.Error)


def _cannot_start(exc: Exception) -> int:
    """EXC logged, the exit code of a sandbox it keeps from starting: 2 for its configuration,
    1 for the rest (the port taken, the db that cannot be opened...)."""
    if isinstance(exc, ConfigError):
        log.error("%s", exc)
        return 2
    log.error("cannot start: %s", exc)
    return 1


def _log_to(path: str) -> None:
    """Standard output and error (the log) go to PATH from here on, as a new process's would."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _follow_stdin(server: SandboxServer, exit_code: list[int]) -> None:
    """--control-stdin: renew the sandbox per line, once the current one answers no request; a
    line that would not start a new process ends this one with that process's exit code; the
    end of stdin stops the server."""
    for line in sys.stdin:
        command = json.loads(line)
        server.sandbox.wait_idle()
        log.info("stopped; faults injected: %s", server.sandbox.faults.injected)
        _log_to(command["log"])
        try:
            config = _configured(command["argv"])[1]
            server.renew(config).store.close()
        except SystemExit as exc:   # argparse printed why
            exit_code[0] = exc.code if isinstance(exc.code, int) else 2
            break
        except _START_ERRORS as exc:
            exit_code[0] = _cannot_start(exc)
            break
        _serving(config, server.server_address[1])
    server.shutdown()


def serve(argv: list[str]) -> int:
    logging.basicConfig(stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        args, config = _configured(argv)
        server, _ = make_server(config)
    except _START_ERRORS as exc:
        return _cannot_start(exc)

    def stop(signum: int, frame: FrameType | None) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    exit_code = [0]
    if args.control_stdin:
        threading.Thread(target=_follow_stdin, args=(server, exit_code), daemon=True).start()
    _serving(config, server.server_address[1])
    try:
        server.serve_forever(poll_interval=0.1)
    finally:
        server.server_close()
        server.sandbox.store.close()
        if not exit_code[0]:
            log.info("stopped; faults injected: %s", server.sandbox.faults.injected)
    return exit_code[0]


def ledger(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m service.sandbox ledger",
                                description="Print the sandbox ledger as JSON lines.")
    p.add_argument("--db", required=True)
    args = p.parse_args(argv)
    if not os.path.exists(args.db):
        print(f"no such database: {args.db}", file=sys.stderr)
        return 2
    out = sys.stdout
    for row in read_ledger(args.db):
        out.write(json.dumps(row, ensure_ascii=False) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["ledger"]:
        return ledger(argv[1:])
    return serve(argv)


if __name__ == "__main__":
    sys.exit(main())
