from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from transforms.money.apportion import apportion_micro, from_micro, to_micro

weights_st = st.lists(st.integers(0, 10_000), min_size=1, max_size=60)


@given(total=st.integers(0, 10**12), weights=weights_st)
def test_shares_are_exact_non_negative_and_within_one_micro(total, weights):
    shares = apportion_micro(total, weights)
    assert len(shares) == len(weights)
    assert sum(shares) == total
    assert all(s >= 0 for s in shares)
    basis = weights if any(weights) else [1] * len(weights)
    for share, w in zip(shares, basis, strict=True):
        exact = Fraction(total * w, sum(basis))
        assert exact - 1 < share < exact + 1
        assert share in (exact.__floor__(), exact.__floor__() + 1)


@given(total=st.integers(0, 10**9), weights=weights_st)
def test_deterministic_and_zero_weight_gets_nothing(total, weights):
    assert apportion_micro(total, weights) == apportion_micro(total, list(weights))
    if any(weights):
        assert all(s == 0 for s, w in zip(apportion_micro(total, weights), weights, strict=True) if w == 0)


def test_ties_go_to_the_lower_index():
    assert apportion_micro(2, [1, 1, 1]) == [1, 1, 0]
    assert apportion_micro(1, [0, 0]) == [1, 0]
    assert apportion_micro(10, [1, 2, 2]) == [2, 4, 4]
    assert apportion_micro(11, [1, 2, 2]) == [2, 5, 4]


def test_empty_and_invalid():
    assert apportion_micro(0, []) == []
    for total, weights in ((5, []), (-1, [1]), (5, [1, -1])):
        with pytest.raises(ValueError):
            apportion_micro(total, weights)


@given(micro=st.integers(0, 10**15))
def test_micro_round_trips(micro):
    assert to_micro(from_micro(micro)) == micro
    assert to_micro(round(from_micro(micro), 6)) == micro


def test_to_micro_of_service_amounts():
    assert to_micro(0.000001) == 1
    assert to_micro(0.012345) == 12345
    assert to_micro(1234.567891) == 1_234_567_891
    assert to_micro(0.1 + 0.2) == 300_000
    assert to_micro(0.0) == 0
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError):
            to_micro(bad)
