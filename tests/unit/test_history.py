"""The gaps between known balance points: filled exactly by this job's unseen charges (lost),
by none of them (other spending), or by what cannot be told apart (ambiguous)."""
from __future__ import annotations

from pipeline.money.reconcile import Candidate, Point, _candidates, _price, _subset, split_gaps
from service.sandbox.money import cost_micro
from transforms.money.apportion import bill_micro


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


def test_an_unanswered_request_is_priced_as_the_service_bills_it():
    """round(tokens x price, 6) RUB, not round(tokens x price x 1e6) micro: at 2.5 RUB per 1M
    one token bills 3 micro-roubles and 5 bill 13, where the other rounding gives 2 and 12.
    Priced the other way, the gap a killed request left was 1 micro off: `others`, not `lost`."""
    price = 2.5e-6
    for tokens in range(1, 5000):
        assert bill_micro(tokens, price) == cost_micro(tokens, price), tokens
    assert (bill_micro(1, price), bill_micro(5, price)) == (3, 13)
    intents = [{"request_id": f"r{t}", "run_id": "run-1", "tokens": t, "at": "1970-01-01T00:00:03+00:00"}
               for t in (1, 5, 9)]
    candidates, torn = _candidates([], intents, {None: price})
    assert [c.cost for c in candidates] == [3, 13, 23] and torn == 0
    points = [Point(900, 900, 0.0), charge(800, 100, 2.0), Point(761, 761, 9.0)]   # gaps: 0, 39
    split = split_gaps(points, candidates)
    assert sum(c.cost for c in split["lost"]) == 39 and split["others"] == split["ambiguous"] == 0


def test_the_billed_price_is_found_from_the_answers_when_the_catalogue_is_off():
    true = 2.7e-6   # the catalogue says 2.5: bills of 1 and 7 tokens are 3 and 19 micro
    answered = [{"total_tokens": t, "cost_rub": cost_micro(t, true) / 1e6} for t in (1, 7, 400, 999)]
    price = _price(answered, 2.5e-6)
    assert all(bill_micro(t, price) == bill_micro(t, true) for t in range(1, 3000))
