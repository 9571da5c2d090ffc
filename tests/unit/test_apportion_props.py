"""Properties of apportion_micro: exact sums, no negative share, each share within one
micro-rouble of its exact proportion, the same answer every time."""
from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transforms.money.apportion import apportion_micro, from_micro, to_micro

totals = st.integers(min_value=0, max_value=10**12)
weights = st.lists(st.integers(min_value=0, max_value=10**6), min_size=1, max_size=60)


@settings(deadline=None, max_examples=300)
@given(totals, weights)
def test_shares_sum_exactly_and_stay_within_one_micro(total, ws):
    shares = apportion_micro(total, ws)
    assert len(shares) == len(ws)
    assert sum(shares) == total
    assert all(s >= 0 for s in shares)
    effective = ws if sum(ws) > 0 else [1] * len(ws)   # all-zero weights split evenly
    whole = sum(effective)
    for share, w in zip(shares, effective, strict=True):
        assert abs(share - Fraction(total * w, whole)) < 1


@settings(deadline=None)
@given(totals, weights)
def test_deterministic(total, ws):
    assert apportion_micro(total, ws) == apportion_micro(total, list(ws))


@settings(deadline=None)
@given(totals, weights)
def test_zero_weight_gets_nothing_when_others_weigh(total, ws):
    if sum(ws) == 0:
        return
    for share, w in zip(apportion_micro(total, ws), ws, strict=True):
        if w == 0:
            assert share == 0


@settings(deadline=None)
@given(st.integers(min_value=0, max_value=10**12))
def test_micro_round_trip(micro):
    assert to_micro(from_micro(micro)) == micro


def test_refusals():
    assert apportion_micro(0, []) == []
    with pytest.raises(ValueError):
        apportion_micro(-1, [1])
    with pytest.raises(ValueError):
        apportion_micro(5, [])
    with pytest.raises(ValueError):
        apportion_micro(5, [1, -1])
