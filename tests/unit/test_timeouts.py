"""ReadTimeouts: how long an attempt waits for its answer, from the answers alone (no HTTP, no
clock): the ceiling before any answer, then 3x what the answers showed (the requests in flight
included), within [read_timeout_s, read_timeout_max_s]; the one retry after a timeout waits the
ceiling. Nothing timed."""
from __future__ import annotations

import pytest

from service.timeouts import FACTOR, WINDOW, Attempt, ReadTimeouts


def test_before_any_answer_a_request_waits_the_ceiling_and_each_counts_the_ones_out_before_it():
    t = ReadTimeouts(60, 300)
    assert [t.first(n) for n in (0, 1, 9)] == [300, 300, 300]
    assert [t.begin() for _ in range(3)] == [(300, 1), (300, 2), (300, 3)]
    for _ in range(3):
        t.end()
    t.observe(200, 10, 1)
    assert t.begin() == (60, 1)


def test_refusals_and_errors_teach_nothing_the_ceiling_holds_until_the_first_2xx():
    """A 429 comes back in milliseconds without the work: counted as an answer, it took the
    timeout to the floor, and a request the busy service then admitted timed out and was billed
    twice (tests/integration/test_client_sandbox.py has that against a sandbox)."""
    t = ReadTimeouts(1, 10)
    for status in (429, 429, 503, 400, 402):
        t.observe(status, 0.005, 1)
    assert t.first() == 10 and t.begin() == (10, 1)
    t.end()
    t.observe(200, 3.0, 1)
    t.observe(429, 0.005, 1)
    assert t.first() == FACTOR * 3.0   # the answer's latency, not the refusal's
    for _ in range(WINDOW):
        t.observe(429, 0.005, 1)       # refusals do not push the answers out of the window
    assert t.first() == FACTOR * 3.0


def test_a_queue_answered_one_at_a_time_is_waited_for_to_the_last_request():
    """Capacity 1, 20 s a request: the ramp sends 9 before the first answer, the k-th is
    answered after 20k s, within its timeout; a request sent behind 8 others once answers came
    waits for them too (the queue the ramp built is still there)."""
    service_s = 20.0
    t = ReadTimeouts(60, 300)
    attempts = [t.begin() for _ in range(9)]
    assert all(service_s * k <= a.timeout_s for k, a in enumerate(attempts, start=1))
    t.observe(200, service_s, 1)
    t.end()
    assert t.first(9) == min(300, FACTOR * 9 * service_s) >= 9 * service_s
    t.observe(200, 2 * service_s, 2)
    t.end()
    assert t.first(1) == FACTOR * 2 * service_s   # the slowest answer, whatever is in flight


def test_a_fast_service_with_many_requests_in_flight_keeps_the_floor():
    t = ReadTimeouts(60, 300)
    for _ in range(10):
        t.observe(200, 1.5, 32)                   # a service with room for all of them
    assert t.first(32) == 60


def test_answers_slower_than_the_floor_are_waited_for_up_to_the_ceiling():
    t = ReadTimeouts(60, 300)
    t.observe(200, 61)
    assert t.first() == FACTOR * 61
    t.observe(200, 200)
    assert t.first() == 300


def test_the_slowest_answer_is_forgotten_after_a_window_of_faster_ones():
    t = ReadTimeouts(1, 300)
    t.observe(200, 50)
    for _ in range(WINDOW - 1):
        t.observe(200, 2)
    assert t.first() == FACTOR * 50
    t.observe(200, 2)
    assert t.first() == FACTOR * 2


def test_the_retry_after_a_timeout_waits_the_ceiling_and_the_timeout_counts_as_that_slow_an_answer():
    t = ReadTimeouts(60, 300)
    assert t.after_timeout(Attempt(60, 1)) == 300 and t.begin(300) == (300, 1)
    t.end()
    assert t.first() == FACTOR * 60          # the requests sent after the timeout wait longer
    assert ReadTimeouts(60, 60).after_timeout(Attempt(60, 1)) == 60


def test_a_ceiling_under_the_floor_is_refused():
    with pytest.raises(ValueError):
        ReadTimeouts(60, 30)
    with pytest.raises(ValueError):
        ReadTimeouts(0, 30)
