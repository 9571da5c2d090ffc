"""`python -m pipeline psql DIR [psql's arguments]`: psql on DIR's embedded database (the one
`publish DIR --to embedded` made), started for it and stopped after (the server's own psql;
`-c "SQL"` for one statement)."""
from __future__ import annotations

import subprocess

from pipeline.exits import UsageError
from pipeline.outdir import OutputDir
from pipeline.publish.embedded import embedded, psql_binary


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        raise UsageError("usage: python -m pipeline psql DIR [psql's arguments, e.g. -c \"SELECT ...\"]")
    OutputDir(argv[0]).require_view()
    with embedded(argv[0]) as db:
        return subprocess.run([str(psql_binary()), db.url, *argv[1:]]).returncode
