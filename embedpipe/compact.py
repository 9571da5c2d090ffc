"""`python -m embedpipe.compact PATH [Beam filesystem options]`: compact a store of paid texts
(embedpipe.compact_store), one line of what was merged; a CLI output DIR is refused in one
line (exit 2), nothing touched."""
from __future__ import annotations

import sys

from apache_beam.options.pipeline_options import PipelineOptions

from embedpipe.store import compact_store
from transforms.dedupe.store import StoreError


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print("usage: python -m embedpipe.compact PATH [Beam filesystem options]", file=sys.stderr)
        return 2
    try:
        done = compact_store(argv[0], PipelineOptions(argv[1:]))
    except StoreError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(f"{argv[0]}: {done.entries} entries and {done.files} files merged into {done.written}, "
          f"{done.texts} texts")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
