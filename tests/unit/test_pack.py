import math
from typing import NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transforms.pack import Packer


@st.composite
def streams(draw, small_items=False):
    max_inputs = draw(st.integers(1, 40))
    max_tokens = draw(st.integers(1, 5000))
    fill = draw(st.sampled_from([0.5, 0.9, 0.95, 1.0]))
    top = max(0, math.floor((1 - fill) * max_tokens)) if small_items else max_tokens * 3 // 2
    sizes = draw(st.lists(st.integers(0, top), max_size=400))
    return Caps(max_inputs, max_tokens, fill, draw(st.integers(1, 6))), list(enumerate(sizes))


class Caps(NamedTuple):
    max_inputs: int
    max_tokens: int
    fill_target: float
    max_open_bins: int


def run(caps, items):
    """(requests closed by add, with the tokens of the item whose add closed them), flushed."""
    packer = Packer(*caps)
    closed = []
    for item in items:
        closed += [(request, item[1]) for request in packer.add(item, item[1])]
    flushed = packer.flush()
    assert packer.flush() == []
    return closed, flushed


@settings(max_examples=300, deadline=None)
@given(streams())
def test_caps_hold_and_every_item_comes_out_once(case):
    caps, items = case
    closed, flushed = run(caps, items)
    requests = [r for r, _ in closed] + flushed
    assert sorted(i for r in requests for i in r) == items   # ids are unique: order recoverable
    for r in requests:
        assert r
        assert len(r) <= caps.max_inputs
        assert sum(t for _, t in r) <= caps.max_tokens or len(r) == 1   # oversize goes alone
    assert len(flushed) <= caps.max_open_bins


@settings(max_examples=300, deadline=None)
@given(streams())
def test_a_request_closed_early_is_full_or_could_not_take_the_next_item(case):
    caps, items = case
    closed, _ = run(caps, items)
    for request, trigger in closed:
        tokens = sum(t for _, t in request)
        assert (tokens >= caps.fill_target * caps.max_tokens or len(request) == caps.max_inputs
                or tokens > caps.max_tokens - trigger)


@settings(max_examples=200, deadline=None)
@given(streams(small_items=True))
def test_small_items_fill_every_request_but_the_flushed_ones(case):
    caps, items = case
    closed, flushed = run(caps, items)
    for request, _ in closed:
        assert (sum(t for _, t in request) >= caps.fill_target * caps.max_tokens
                or len(request) >= caps.fill_target * caps.max_inputs)
    assert len(flushed) <= 1   # small items always fit the one open request


@settings(max_examples=200, deadline=None)
@given(streams())
def test_no_two_flushed_requests_could_have_been_one(case):
    caps, items = case
    _, flushed = run(caps, items)
    for i, a in enumerate(flushed):
        for b in flushed[i + 1:]:
            assert (sum(t for _, t in a + b) > caps.max_tokens or len(a) + len(b) > caps.max_inputs)


def test_realistic_mix_fills_to_the_target():
    # text-embedding-3-small caps; 30% full-size chunks, 15% tails of long documents, short docs
    max_inputs, max_tokens = 2048, 300_000
    sizes = [8191 - i % 800 if i % 10 < 3 else 800 + i % 3000 if i % 10 < 5 else 5 + i % 400
             for i in range(20_000)]
    packer = Packer(max_inputs, max_tokens)
    requests = [r for i, n in enumerate(sizes) for r in packer.add(i, n)]
    fills = [sum(sizes[i] for i in r) / max_tokens for r in requests]
    assert min(fills) >= 0.95
    flushed = packer.flush()
    lower_bound = math.ceil(sum(sizes) / max_tokens)
    assert len(requests) + len(flushed) <= lower_bound * 1.06


def test_oversize_and_exact_size_items_go_alone():
    packer = Packer(10, 100)
    assert packer.add("a", 30) == []
    assert packer.add("big", 101) == [["big"]]
    assert packer.add("exact", 100) == [["exact"]]
    assert packer.flush() == [["a"]]


def test_input_cap_closes_a_request():
    packer = Packer(3, 1000)
    assert [packer.add(i, 1) for i in range(4)] == [[], [], [[0, 1, 2]], []]
    assert packer.flush() == [[3]]


def test_overflow_closes_the_fullest():
    packer = Packer(100, 100, max_open_bins=2)
    assert packer.add("a", 60) == []
    assert packer.add("b", 70) == []
    assert packer.add("c", 50) == [["b"]]
    assert packer.flush() == [["a"], ["c"]]


@pytest.mark.parametrize("args", [(0, 10), (10, 0), (10, 10, 0.0), (10, 10, 1.1), (10, 10, 0.9, 0)])
def test_limits_are_validated(args):
    with pytest.raises(ValueError):
        Packer(*args)


def test_negative_tokens_are_refused():
    with pytest.raises(ValueError):
        Packer(10, 10).add("x", -1)
