"""AimdLimiter and TokenBucketLimiter: invariants under random operation sequences, real threads
for the concurrency gate, a fake clock for the buckets (no timing assertions)."""
from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transforms.ratelimit import IGNORED, OK, RATE_LIMITED, AimdLimiter, TokenBucketLimiter

EPS = 1e-6


# -- AIMD ---------------------------------------------------------------------------------

def fill(limiter: AimdLimiter) -> list:
    permits = []
    while (p := limiter.acquire(timeout=0)) is not None:
        permits.append(p)
    return permits


def test_grows_by_one_per_window_of_successes():
    lim = AimdLimiter(4, maximum=100)
    held = fill(lim)
    for expected in (5, 6, 7):
        for _ in range(lim.allowed):   # one window of successes with the limit in use
            held.pop(0).release(OK)
            held += fill(lim)
        assert lim.allowed == expected and len(held) == expected
    for p in held:
        p.release(OK)


def test_rate_limit_halves_once_per_window():
    lim = AimdLimiter(16, maximum=16)
    permits = fill(lim)
    assert len(permits) == 16
    for p in permits:          # every request in flight at the old rate gets a 429
        p.release(RATE_LIMITED)
    assert lim.limit == 8 and lim.decreases == 1 and lim.rate_limited_count == 16
    fresh = lim.acquire(timeout=0)   # sent after the decrease: its 429 is news
    fresh.release(RATE_LIMITED)
    assert lim.limit == 4 and lim.decreases == 2


def test_never_below_minimum_nor_above_maximum():
    lim = AimdLimiter(2, minimum=2, maximum=3)
    for _ in range(5):
        lim.acquire(timeout=0).release(RATE_LIMITED)
    assert lim.limit == 2
    for _ in range(100):
        for p in fill(lim):
            p.release(OK)
    assert lim.limit == 3


def test_blocks_at_the_limit_and_a_release_lets_the_next_in():
    lim = AimdLimiter(2, maximum=2)
    first, second = lim.acquire(), lim.acquire()
    assert lim.acquire(timeout=0) is None
    got = []
    waiter = threading.Thread(target=lambda: got.append(lim.acquire()))
    waiter.start()
    first.release(OK)
    waiter.join(10)
    assert not waiter.is_alive() and got[0] is not None and lim.in_flight == 2
    second.release(OK)
    got[0].release(OK)


def test_a_retried_429_slows_the_others_at_once_and_its_success_does_not_grow():
    lim = AimdLimiter(4, maximum=8)
    permits = fill(lim)
    permits[0].rate_limited()      # the client's on_retry hook, request still in flight
    assert lim.allowed == 2 and lim.acquire(timeout=0) is None
    permits[0].release(OK)         # the retry succeeded
    assert lim.limit == 2
    for p in permits[1:]:
        p.release(OK)


def test_unsaturated_successes_and_ignored_errors_do_not_grow():
    lim = AimdLimiter(4, maximum=8)
    for _ in range(50):
        lim.acquire().release(OK)          # one at a time: the limit is not in use
    for p in fill(lim):
        p.release(IGNORED)
    assert lim.limit == 4


def test_slot_classifies_exceptions():
    class Status(Exception):
        def __init__(self, status):
            self.status = status

    lim = AimdLimiter(4, maximum=4)
    with pytest.raises(Status):
        with lim.slot():
            raise Status(429)
    assert lim.limit == 2
    with pytest.raises(Status):
        with lim.slot():
            raise Status(500)
    assert lim.limit == 2 and lim.in_flight == 0


def test_release_twice_and_bad_arguments_are_refused():
    lim = AimdLimiter(1, maximum=1)
    p = lim.acquire()
    p.release()
    with pytest.raises(RuntimeError):
        p.release()
    with pytest.raises(ValueError):
        lim.acquire().release("maybe")
    for args in ((0,), (5, 1, 4), (2, 3, 4)):
        with pytest.raises(ValueError):
            AimdLimiter(*args)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["acquire", "release"]), st.integers(0, 30),
                          st.sampled_from([OK, OK, OK, RATE_LIMITED, IGNORED])), max_size=300),
       st.integers(1, 4), st.integers(4, 40))
def test_random_sequences_keep_the_invariants(ops, minimum, maximum):
    lim = AimdLimiter(minimum, minimum=minimum, maximum=maximum)
    held = []
    for op, pick, outcome in ops:
        if op == "acquire":
            p = lim.acquire(timeout=0)
            if p is None:
                assert lim.in_flight >= lim.allowed
            else:
                held.append(p)
                assert lim.in_flight <= lim.allowed
        elif held:
            before, epoch = lim.limit, lim.decreases
            p = held.pop(pick % len(held))
            p.release(outcome)
            if outcome == RATE_LIMITED and lim.decreases > epoch:
                assert lim.limit == pytest.approx(max(minimum, before * 0.5))
            elif outcome != OK:
                assert lim.limit == before
            else:
                assert lim.limit in (before, min(maximum, before + 1))
        assert minimum <= lim.limit <= maximum
        assert lim.in_flight == len(held)


def test_threads_never_exceed_the_allowed_concurrency():
    lim = AimdLimiter(3, maximum=12)
    lock = threading.Lock()
    state = {"now": 0, "violations": 0, "peak": 0, "n": 0}

    def worker(seed):
        for i in range(300):
            permit = lim.acquire()
            with lock:
                state["now"] += 1
                state["n"] += 1
                state["peak"] = max(state["peak"], state["now"])
                # concurrency may exceed a limit that dropped after its slots were granted,
                # never the highest limit reached
                if state["now"] > 12:
                    state["violations"] += 1
                rate_limited = (state["n"] * 7 + seed) % 50 == 0
            with lock:
                state["now"] -= 1
            permit.release(RATE_LIMITED if rate_limited else OK)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert state["violations"] == 0 and lim.in_flight == 0
    assert 1 <= lim.limit <= 12 and lim.decreases >= 1


# -- token buckets ------------------------------------------------------------------------

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
