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

from .config import build_parser, config_from_args
from .server import make_server
from .store import read_ledger

log = logging.getLogger("service.sandbox")


def _write_ready_file(path: str, port: int) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"port": port, "pid": os.getpid()}, fh)
    os.replace(tmp, path)   # readers never see a half-written file


def serve(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=args.log_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = config_from_args(args)
        server, sandbox = make_server(config)
    except ConfigError as exc:
        log.error("%s", exc)
        return 2
    except (OSError, sqlite3.Error) as exc:   # the port is taken, the db cannot be opened...
        log.error("cannot start: %s", exc)
        return 1
    port = server.server_address[1]
    keys = ", ".join(f"{k.key_id}@{k.account}" for k in config.keys)   # fingerprints only
    log.info("serving http://%s:%d/v1 (db %s, keys %s, precheck %s, capacity %s (%s), faults %s)", config.host,
             port, config.db, keys, config.precheck, config.capacity or "unlimited", config.capacity_mode,
             config.faults)

    def stop(signum: int, frame: FrameType | None) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if config.ready_file:
        _write_ready_file(config.ready_file, port)
    try:
        server.serve_forever(poll_interval=0.1)
    finally:
        server.server_close()
        sandbox.store.close()
        log.info("stopped; faults injected: %s", sandbox.faults.injected)
    return 0


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
