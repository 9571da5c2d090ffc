"""TokenBucketLimiter on a fake clock: requests and tokens per minute, bursts, the order of
callers. Nothing timed."""
from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transforms.embed.quota import TokenBucketLimiter

EPS = 1e-6

class FakeClock:
    def __init__(self):
        self.now = 1000.0
        self.slept = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)


def bucket(rpm=0, tpm=0, burst_s=1.0):
    clock = FakeClock()
    return TokenBucketLimiter(rpm, tpm, burst_s=burst_s, clock=clock, sleep=clock.sleep), clock


def test_off_never_waits():
    lim, clock = bucket()
    assert not lim.enabled
    assert all(lim.acquire(10 ** 9) == 0 for _ in range(100)) and clock.slept == []


def test_requests_per_minute_spaces_requests():
    lim, clock = bucket(rpm=120, burst_s=1.0)   # 2 per second, burst of 2
    waits = [lim.reserve() for _ in range(6)]
    assert waits == pytest.approx([0, 0, 0.5, 1.0, 1.5, 2.0])


def test_a_request_larger_than_the_burst_waits_for_a_full_bucket_then_borrows():
    lim, clock = bucket(tpm=60_000, burst_s=1.0)   # 1000 tokens/s, burst 1000
    assert lim.reserve(5000) == 0                  # full bucket: goes, 4000 in debt
    assert lim.reserve(10) == pytest.approx(4.01)  # the debt is paid first
    clock.now += 10
    assert lim.reserve(10) == 0


def test_both_limits_wait_for_the_slower_one():
    lim, clock = bucket(rpm=60, tpm=600, burst_s=1.0)   # 1 req/s, 10 tokens/s
    assert lim.acquire(10) == 0
    assert lim.acquire(5) == pytest.approx(1.0)          # request bucket binds
    assert lim.acquire(30) == pytest.approx(2.0)         # a full burst of tokens; 20 borrowed
    assert lim.acquire(1) == pytest.approx(4.1)          # tokens bind: the debt first
    assert clock.slept == pytest.approx([1.0, 2.0, 4.1])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 5), st.integers(0, 3000)), min_size=1, max_size=60),
       st.sampled_from([0, 30, 600]), st.sampled_from([0, 6000, 90_000]), st.sampled_from([0.5, 1.0, 10.0]))
def test_admissions_never_beat_the_quota_and_never_wait_needlessly(calls, rpm, tpm, burst_s):
    lim, clock = bucket(rpm, tpm, burst_s)
    start, admitted = clock.now, []
    for gap, tokens in calls:
        clock.now += gap
        wait = lim.reserve(tokens)
        assert wait >= 0 and (wait == 0 or lim.enabled)
        at = clock.now + wait
        assert not admitted or at >= admitted[-1][0] - EPS      # first come, first served
        admitted.append((at, tokens))
    for per_minute, amount in ((rpm, lambda n: 1), (tpm, lambda n: n)):
        if not per_minute:
            continue
        rate, cap = per_minute / 60, max(1.0, per_minute / 60 * burst_s)
        taken = 0.0
        for at, n in admitted:
            # before taking, the bucket held at least min(n, burst)
            assert taken + min(amount(n), cap) <= cap + rate * (at - start) + 1e-6 * (1 + taken)
            taken += amount(n)


def test_threads_are_served_one_reservation_each():
    clock = FakeClock()
    lock = threading.Lock()
    lim = TokenBucketLimiter(600, 0, burst_s=1.0, clock=clock, sleep=lambda s: None)   # 10/s, burst 10
    waits = []

    def worker():
        for _ in range(25):
            w = lim.reserve()
            with lock:
                waits.append(w)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    # the clock never moved: 200 reservations are spaced 0.1 s apart after a burst of 10
    assert sorted(waits) == pytest.approx([0.0] * 10 + [0.1 * k for k in range(1, 191)])


def test_bad_arguments():
    with pytest.raises(ValueError):
        TokenBucketLimiter(-1, 0)
    with pytest.raises(ValueError):
        TokenBucketLimiter(0, 0, burst_s=0)
    with pytest.raises(ValueError):
        TokenBucketLimiter(10, 0).reserve(-1)
