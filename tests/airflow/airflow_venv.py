"""The separate Airflow virtualenv the DAG test runs in (.venv-airflow/; see tests/side_venv.py).

Airflow cannot share the project venv (its pins fight Beam's). It holds exactly
requirements-airflow.lock, which `make lock` resolves from requirements.in here.

    python -m tests.airflow.airflow_venv      # builds if needed, prints the venv's python
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.side_venv import REPO, SideVenv

AIRFLOW = SideVenv(Path(os.environ.get("AIRFLOW_TEST_VENV", REPO / ".venv-airflow")), REPO / "requirements-airflow.lock")


def venv_python() -> Path:
    return AIRFLOW.python


def ensure_venv(log=sys.stderr) -> Path:
    return AIRFLOW.ensure(log)


if __name__ == "__main__":
    print(ensure_venv())
