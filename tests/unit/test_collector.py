"""The worker's garbage collector: frozen once at set-up, a larger young generation."""
import gc

import pytest

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
    assert gc.get_freeze_count() == frozen and later


def test_cycles_made_after_set_up_are_still_collected(fresh_collector):
    collector.tune_once()

    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a
    del a, b
    assert gc.collect() >= 2
