"""Each thread's current frame, read without the deadlock of CPython before 3.11.9 and 3.12.3
(python/cpython#106883): sys._current_frames holds the interpreter's thread list while it makes
its dict, a garbage collection there runs finalizers that wait for the GIL, and a thread ending
meanwhile holds the GIL while it waits for that list. With collection off, nothing waits."""
from __future__ import annotations

import gc
import sys
from types import FrameType


def current_frames() -> dict[int, FrameType]:
    collecting = gc.isenabled()
    gc.disable()
    try:
        return sys._current_frames()
    finally:
        if collecting:
            gc.enable()
