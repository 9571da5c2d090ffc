"""`python -m pipeline psql DIR [psql's arguments]`: psql on DIR's embedded database (the one
`publish DIR --to embedded` made), started for it and stopped after (the server's own psql;
`-c "SQL"` for one statement)."""
from __future__ import annotations

import subprocess

from pipeline.exits import UsageError
from pipeline.outdir import OutputDir
from pipeline.publish.embedded import embedded, psql_binary


USAGE = "usage: python -m pipeline psql DIR [psql's arguments, e.g. -c \"SELECT ...\"]"


def main(argv: list[str]) -> int:
    if argv[:1] in (["-h"], ["--help"]):
        print(f"{USAGE}\n\n{__doc__}")
        return 0
    if not argv or argv[0].startswith("-"):
        raise UsageError(USAGE)
    OutputDir(argv[0]).require_view()
    with embedded(argv[0]) as db:
        return subprocess.run([str(psql_binary()), db.url, *argv[1:]]).returncode
