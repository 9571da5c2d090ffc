"""The gaps between known balance points: filled exactly by this job's unseen charges (lost),
by none of them (other spending), or by what cannot be told apart (ambiguous)."""
from __future__ import annotations

from pipeline.money.reconcile import Candidate, Point, _subset, split_gaps


def charge(after: int, cost: int, at: float) -> Point:
    return Point(after + cost, after, at)


def test_subset_finds_an_exact_sum_or_none():
    assert sorted(_subset(7, [5, 3, 4, 9])) == [1, 2]
    assert _subset(6, [5, 4]) is None
    assert _subset(0, [1]) is None


def test_a_gap_filled_by_a_request_in_flight_at_a_kill_is_lost():
    points = [Point(1000, 1000, 0.0), charge(900, 100, 1.0), charge(750, 120, 2.0), Point(700, 700, 9.0)]
    lost = Candidate(30, 1.5, "in_flight", "r1")
    never_sent = Candidate(45, 2.5, "in_flight", "r1")
    split = split_gaps(points, [never_sent, lost])
    # gaps: 1000-1000=0, 900-870=30, 750-700=50
    assert split["lost"] == [lost]
    assert split["unmatched"] == [never_sent]
    # the last gap, 50: the unsent request's 45 fits in it, so 45 may be ours; 5 cannot be
    assert (split["others"], split["ambiguous"]) == (5, 45)


def test_a_gap_before_a_candidate_was_sent_is_other_spending():
    # 40 spent by someone else between the first two charges; the candidate was sent after
    # the second charge was answered, so it cannot sit in that gap
    points = [Point(1000, 1000, 0.0), charge(900, 100, 1.0), charge(760, 100, 2.0), charge(630, 100, 3.0),
              Point(630, 630, 9.0)]  # gaps: 0, 40 (before the candidate was sent), 30, 0
    lost = Candidate(30, 2.5, "in_flight", "r1")
    split = split_gaps(points, [lost])
    assert split["lost"] == [lost] and split["others"] == 40 and split["ambiguous"] == 0


def test_a_retried_attempt_billed_twice_is_lost_and_a_top_up_is_counted():
    points = [Point(1000, 1000, 0.0), charge(880, 100, 1.0), Point(980, 980, 2.0), charge(900, 80, 3.0),
              Point(900, 900, 4.0)]
    retried = Candidate(20, 0.5, "retried", "r1")
    split = split_gaps(points, [retried])
    assert split["lost"] == [retried]
    assert split["rises"] > 0
