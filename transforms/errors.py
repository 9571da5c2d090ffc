"""An error in one line, wherever it was raised: here, or on a worker, whose exception the
runner hands over as text (another process's traceback, the worker's exception on its last
line, the step's name appended)."""
from __future__ import annotations

import re

_WHILE_RUNNING = re.compile(r"\s*\[while running '[^']*'\]\s*$")


def one_line(exc: BaseException, *, worker: bool = False) -> str:
    """EXC's message in one line: its first (a database error's next ones are the statement and
    a caret), or its type's name when it has none. WORKER: EXC is a failed job's, and the line
    is its last (the worker's exception), without the runner's step name."""
    lines = str(exc).strip().splitlines()
    if not lines:
        return type(exc).__name__
    return _WHILE_RUNNING.sub("", lines[-1]) if worker else lines[0]
