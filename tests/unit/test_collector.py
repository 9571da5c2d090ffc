"""The garbage collector: held off while Beam is imported (pipeline/__init__.py); in a worker,
frozen once at set-up with a larger young generation."""
import gc
import py_compile
import subprocess
import sys

import pytest

import pipeline
from transforms.worker import collector


@pytest.fixture
def fresh_collector():
    threshold = gc.get_threshold()
    collector.tune_once.cache_clear()
    yield
    collector.tune_once.cache_clear()
    gc.unfreeze()
    gc.set_threshold(*threshold)


def test_what_is_alive_at_set_up_is_frozen_once_and_the_young_generation_grows(fresh_collector):
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    alive = [object() for _ in range(10)] + [[] for _ in range(10)]
    collector.tune_once()
    frozen = gc.get_freeze_count()
    assert frozen >= len(alive) and gc.get_threshold() == (collector.YOUNG_THRESHOLD, 10, 10)
    later = [[] for _ in range(100)]
    collector.tune_once()                       # once per process: nothing more is frozen
    # (frozen objects that another test's lingering threads free leave the count: it may only fall)
    assert gc.get_freeze_count() <= frozen and later


def test_cycles_made_after_set_up_are_still_collected(fresh_collector):
    collector.tune_once()

    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a
    del a, b
    assert gc.collect() >= 2


def _after_importing_pipeline(before: str) -> list[str]:
    """In a fresh interpreter: run BEFORE, import the driver's package (Beam with it), report."""
    code = (f"import ctypes, gc, logging, os; {before}; seen = []; "   # the package's own imports first
            "gc.callbacks.append(lambda phase, info: seen.append(phase)); "
            "import pipeline; print(gc.isenabled(), gc.get_freeze_count(), len(seen))")
    py_compile.compile(pipeline.__file__, doraise=True)   # compiling the package is not importing Beam
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()


def test_importing_beam_runs_no_collection_and_freezes_what_it_made_then_collects_again():
    enabled, frozen, collections = _after_importing_pipeline("pass")
    assert (enabled, collections) == ("True", "0")
    assert int(frozen) > 100_000     # Beam's modules, classes and functions: never scanned again
    cycle = "class Node: pass\na, b = Node(), Node(); a.other, b.other = b, a; del a, b"
    done = subprocess.run([sys.executable, "-c", f"import gc, pipeline\n{cycle}\nprint(gc.collect())"],
                          capture_output=True, text=True, timeout=120)
    assert int(done.stdout.split()[-1]) >= 2


def test_a_collector_switched_off_before_the_import_stays_off():
    enabled, _, _ = _after_importing_pipeline("gc.disable()")
    assert enabled == "False"
