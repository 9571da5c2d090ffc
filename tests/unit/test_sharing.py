"""AccountSharing: whether others still spend on the account, from the balance after each answer."""
import random

import pytest

from transforms.embed.sharing import AccountSharing

COST = 1_000   # micro-units a request costs
RTT = 1.0


class Account:
    """One balance, charged by this process and by others; this process's answers read it."""

    def __init__(self):
        self.balance = 10**9
        self.sharing = AccountSharing()
        self.now = 0.0

    def others_spend(self, requests: int) -> None:
        self.balance -= requests * COST

    def answer(self, places: int = 1) -> bool:
        self.now += RTT / places
        self.balance -= COST
        return self.sharing.answered(self.now, COST, self.balance, places, RTT)


def test_the_others_stopping_is_told_once_after_a_quiet_span():
    acct = Account()
    for _ in range(20):   # another process with a request in flight all along: one charge per answer
        acct.others_spend(1)
        assert not acct.answer()
    assert acct.sharing.shared
    told = [acct.answer() for _ in range(20)]
    assert told.count(True) == 1 and not acct.sharing.shared
    assert 7 <= told.index(True) <= 9   # quiet for as long as they took to spend 8 x the tolerance


def test_alone_from_the_start_is_never_news():
    acct = Account()
    assert not any(acct.answer(places=4) for _ in range(200))
    assert not acct.sharing.shared


def test_its_own_requests_answered_out_of_order_are_not_others():
    """With 8 in flight, each answer's balance may already include up to 7 of its own later
    charges, or miss them: within the tolerance, never 'shared'."""
    rng, acct, out = random.Random(0), Account(), []
    for _ in range(2000):
        acct.balance -= COST   # charged as it is sent...
        out.append(acct.balance)
        if len(out) == 8:      # ...answered in any order
            acct.now += rng.uniform(0, RTT / 4)
            acct.sharing.answered(acct.now, COST, out.pop(rng.randrange(8)), 8, RTT)
        assert not acct.sharing.shared


def test_others_spending_little_but_steadily_keep_it_shared():
    """One other request a round trip against 4 of ours is more than twice the tolerance over
    a window (15 round trips at 4 places): shared, and it stays so."""
    acct = Account()
    for i in range(400):
        if i % 4 == 0:
            acct.others_spend(1)
        assert not acct.answer(places=4)
    assert acct.sharing.shared


def test_a_new_spender_after_a_quiet_spell_is_seen_and_its_end_told_again():
    acct = Account()
    for _spell in range(2):
        for _ in range(20):
            acct.others_spend(2)
            acct.answer()
        assert acct.sharing.shared
        assert [acct.answer() for _ in range(40)].count(True) == 1   # the second quiet span: twice the first


@pytest.mark.parametrize("places", [1, 2, 4])
@pytest.mark.parametrize("rate", [0.2, 0.5, 1.0])
def test_a_spender_at_random_times_is_not_taken_for_gone(places, rate):
    """Another client sends at random times (Poisson, RATE requests a round trip of ours, each
    costing what ours do): with a window alone, it flipped 64-430 times in 10,000 round trips
    (a review's count), each a 429 or more. Over 2,000 round trips: at most once."""
    for seed in range(3):
        rng, acct = random.Random(seed), Account()
        for _ in range(2000 * places):
            acct.others_spend(sum(rng.random() < rate / places / 16 for _ in range(16)))
            acct.answer(places)
        assert acct.sharing.told <= 1


def test_a_top_up_hides_the_others_until_the_balance_is_under_its_lowest_again():
    """Told too soon at most once; the others are seen again once the top-up is spent."""
    acct = Account()
    for i in range(200):
        if i == 50:
            acct.balance += 40 * COST
        acct.others_spend(1)
        acct.answer()
    assert acct.sharing.told <= 1 and acct.sharing.shared


def test_answers_above_the_lowest_balance_while_shared_never_break_the_rate():
    """A review's case: others spend, then answers sit above the lowest balance (a top-up, or
    late answers) while this process's costs still count. Its estimate of what the others spent
    since first seen fell to 0, and the rate divided by it."""
    sharing, lowest = AccountSharing(), 10**9
    sharing.answered(0.0, COST, lowest, 1, RTT)
    for at, others in enumerate([2, None, None, None, 3, 0, 3, None, None, None] * 3, 1):
        if others is not None:
            lowest -= (1 + others) * COST
        sharing.answered(float(at), COST, lowest if others is not None else lowest + 1, 1, RTT)


def test_more_places_do_not_hide_the_others_for_a_whole_new_window():
    """From 1 place to 32 the window grows 16x, past every entry kept: 'shared' waited ~78 round
    trips for a window of history (a review's count). A shorter span is stricter, so it is used."""
    acct = Account()
    for _ in range(50):
        acct.answer(1)
    for i in range(32 * 5):   # 5 round trips at 32 places, others at 40 requests a round trip
        acct.others_spend(1 + (i % 4 == 0))
        acct.answer(32)
    assert acct.sharing.shared
