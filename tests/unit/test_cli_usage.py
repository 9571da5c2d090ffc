"""The CLI's usage (pipeline/cli.py's docstring, printed for no command or an unknown one)
names every command it runs, in its first line and with a line of its own."""
from __future__ import annotations

import re

from pipeline.cli import COMMANDS, USAGE


def test_the_usage_names_every_command():
    first = USAGE.splitlines()[0]
    listed = re.split(r",\s*", first.split(":", 1)[1].strip().rstrip("."))
    assert listed == list(COMMANDS)
    assert all(re.search(rf"^\s+python -m pipeline {name}\b", USAGE, re.M) for name in COMMANDS), USAGE
