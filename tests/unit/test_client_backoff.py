"""The retry schedule as pure functions: backoff, Retry-After parsing, the attempt/time caps."""
import email.utils

import pytest

from service.client import RetryPolicy, backoff_delay, next_wait, parse_retry_after
from service.errors import is_retryable_status

POLICY = RetryPolicy(max_attempts=6, initial_backoff_s=0.5, max_backoff_s=4.0, max_total_s=30.0,
                     jitter=0.25)


def test_defaults_are_safe():
    p = RetryPolicy()
    assert (p.max_attempts, p.initial_backoff_s, p.max_backoff_s, p.max_total_s) == (6, 0.5, 20.0, 120.0)
    assert (p.connect_timeout_s, p.read_timeout_s, p.jitter) == (5.0, 60.0, 0.25)


@pytest.mark.parametrize("bad", [dict(max_attempts=0), dict(jitter=1.5), dict(read_timeout_s=0),
                                 dict(initial_backoff_s=-1)])
def test_policy_rejects_nonsense(bad):
    with pytest.raises(ValueError):
        RetryPolicy(**bad)


def test_exponential_without_jitter_doubles_then_caps():
    waits = [backoff_delay(POLICY, n, None, rand=0.0) for n in range(1, 8)]
    assert waits == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0]


def test_jitter_only_shortens_computed_waits_by_at_most_the_fraction():
    for n in range(1, 6):
        full = backoff_delay(POLICY, n, None, 0.0)
        lowest = backoff_delay(POLICY, n, None, 0.999999)
        assert full * 0.75 <= lowest <= full


def test_retry_after_is_a_floor_and_jitter_only_lengthens_it():
    assert backoff_delay(POLICY, 1, 3.0, 0.0) == 3.0
    assert 3.0 <= backoff_delay(POLICY, 1, 3.0, 0.99) <= 3.75
    # a server wait above max_backoff_s is still honoured
    assert backoff_delay(POLICY, 1, 10.0, 0.0) == 10.0
    # zero means "no advice": fall back to our own schedule
    assert backoff_delay(POLICY, 3, 0.0, 0.0) == 2.0


def test_huge_retry_numbers_do_not_overflow():
    assert backoff_delay(POLICY, 10_000, None, 0.0) == 4.0


def test_next_wait_stops_after_max_attempts():
    assert next_wait(POLICY, 5, 0.0, None, 0.0) == 4.0
    assert next_wait(POLICY, 6, 0.0, None, 0.0) is None


def test_429s_count_against_max_refusals_not_max_attempts():
    p = RetryPolicy(max_attempts=2, max_refusals=3, max_total_s=30.0, jitter=0)
    assert next_wait(p, 3, 0.0, 1.0, 0.0, refusals=3) == 1.0      # 3 refusals: still waits
    assert next_wait(p, 4, 0.0, 1.0, 0.0, refusals=4) is None     # a 4th: gives up
    assert next_wait(p, 4, 0.0, None, 0.0, refusals=3) == 4.0     # 1 failure after 3 refusals, of 2
    assert next_wait(p, 5, 0.0, None, 0.0, refusals=3) is None    # the 2nd failure ends it
    once = RetryPolicy(max_attempts=1, max_refusals=0)
    assert next_wait(once, 1, 0.0, 1.0, 0.0, refusals=1) is None  # tries once: a 429 ends it too


def test_next_wait_stops_when_the_wait_would_pass_the_total_cap():
    assert next_wait(POLICY, 1, 29.0, None, 0.0) == 0.5
    assert next_wait(POLICY, 1, 29.6, None, 0.0) is None
    # a Retry-After longer than what is left gives up at once (the caller sees retry_after)
    assert next_wait(POLICY, 1, 0.0, 31.0, 0.0) is None


def test_full_schedule_with_defaults():
    p, elapsed, waits, attempts = RetryPolicy(), 0.0, [], 1
    while (w := next_wait(p, attempts, elapsed, None, 0.0)) is not None:
        waits.append(w)
        elapsed += w
        attempts += 1
    assert waits == [0.5, 1.0, 2.0, 4.0, 8.0] and attempts == 6


@pytest.mark.parametrize("headers,expected", [
    ({"retry-after": "2"}, 2.0),
    ({"retry-after": "1.5"}, 1.5),
    ({"retry-after-ms": "250"}, 0.25),
    ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),     # ms wins, as in openai-python
    ({"retry-after-ms": "junk", "retry-after": "9"}, 9.0),
    ({"retry-after": "-3"}, 0.0),
    ({"retry-after": "soon"}, None),
    ({"retry-after": "nan"}, None),
    ({}, None),
])
def test_parse_retry_after_numbers(headers, expected):
    assert parse_retry_after(headers) == expected


def test_parse_retry_after_http_date():
    now = 1_700_000_000.0
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert parse_retry_after({"retry-after": date}, now=now) == pytest.approx(30.0)
    past = email.utils.formatdate(now - 30, usegmt=True)
    assert parse_retry_after({"retry-after": past}, now=now) == 0.0


@pytest.mark.parametrize("status,retryable", [
    (400, False), (401, False), (402, False), (403, False), (404, False), (413, False),
    (422, False), (408, True), (409, True), (429, True), (500, True), (502, True), (503, True),
    (504, True)])
def test_which_statuses_are_retried(status, retryable):
    assert is_retryable_status(status) is retryable
