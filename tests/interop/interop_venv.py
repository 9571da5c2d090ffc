"""The interop test venv (.venv-interop/): DuckDB, Polars, chdb (ClickHouse), pyarrow, numpy, exactly
requirements-interop.lock (which `make lock` resolves from requirements.in here).

    python -m tests.interop.interop_venv      # builds if needed, prints the venv's python
"""
from __future__ import annotations

import os
from pathlib import Path

from tests.side_venv import REPO, SideVenv

INTEROP = SideVenv(Path(os.environ.get("INTEROP_TEST_VENV", REPO / ".venv-interop")), REPO / "requirements-interop.lock")

if __name__ == "__main__":
    print(INTEROP.ensure())
