"""The library's claims (transforms/dedupe/inflight.py): rows join their own bundle's claim, the
seal finds a text's claim by the bundle its item names (never another attempt's), a failed
bundle's claims go, and a row whose text is in flight waits for that request's settle (no
time bound), then takes it from the store or claims it again."""
from __future__ import annotations

import threading
import time

from transforms.dedupe.inflight import FIRST, JOINED, STORED_ALREADY, InFlightClaims
from transforms.records import ChunkRef, Request, TextItem
from transforms.worker.keyindex import key16

SHA = "ab" * 32


def _ref(doc: str) -> ChunkRef:
    return ChunkRef(doc, 0, 1, 0, 3, 3, ())


def _never(key):
    return False


def _item(doc: str, bundle: int) -> TextItem:
    return TextItem(SHA, "text", 3, (_ref(doc),), bundle)


def _docs(request: Request) -> list[str]:
    return [r.doc_id for item in request for r in item.refs]


def test_a_retry_seals_its_own_claim_with_every_row_that_joined_it():
    """The failed attempt's claim (a, b) is still open (its teardown never ran): the retry's
    seal takes the retry's rows, c included, and the stale claim is not sent."""
    claims = InFlightClaims()
    failed, retry = claims.bundle(), claims.bundle()
    assert claims.add(SHA, _ref("a"), failed, _never) == FIRST
    assert claims.add(SHA, _ref("b"), failed, _never) == JOINED
    for doc, kind in (("a", FIRST), ("b", JOINED), ("c", JOINED)):
        assert claims.add(SHA, _ref(doc), retry, _never) == kind
    sealed, sent = claims.seal(Request([_item("a", retry)]))
    assert _docs(sealed) == ["a", "b", "c"] and sent == [key16(SHA)]
    claims.settle(sent)
    claims.release(failed)
    assert claims.add(SHA, _ref("d"), claims.bundle(), _never) == FIRST   # nothing of either left


def test_a_failed_bundles_claims_are_released():
    claims = InFlightClaims()
    failed = claims.bundle()
    claims.add(SHA, _ref("a"), failed, _never)
    claims.release(failed)
    sealed, sent = claims.seal(Request([_item("a", failed)]))   # no claim left: the item as it is
    assert _docs(sealed) == ["a"] and sent == []


def test_a_row_whose_text_is_in_flight_waits_for_the_settle_however_long():
    claims, bundle, paid = InFlightClaims(), InFlightClaims.bundle(), set()   # of key16s
    assert claims.add(SHA, _ref("a"), bundle, paid.__contains__) == FIRST
    _, sent = claims.seal(Request([_item("a", bundle)]))
    got = []
    waiting = threading.Thread(target=lambda: got.append(claims.add(SHA, _ref("c"), claims.bundle(),
                                                                    paid.__contains__)))
    waiting.start()
    time.sleep(1.0)
    assert got == [] and waiting.is_alive()   # the answer is not in yet
    paid.add(key16(SHA))                      # the store holds it...
    claims.settle(sent)                       # ...and the request is over
    waiting.join(timeout=5)
    assert got == [STORED_ALREADY]


def test_a_text_whose_request_ended_without_a_vector_is_claimed_again():
    claims, bundle = InFlightClaims(), InFlightClaims.bundle()
    claims.add(SHA, _ref("a"), bundle, _never)
    claims.settle(claims.seal(Request([_item("a", bundle)]))[1])
    assert claims.add(SHA, _ref("b"), claims.bundle(), _never) == FIRST


def test_a_settle_counts_only_what_its_seal_put_in_flight():
    """Two requests of one text (two bundles claimed it at once): the first to end does not let
    the waiting rows go while the other is still in flight; an item no claim sealed counts nothing."""
    claims, one, two = InFlightClaims(), InFlightClaims.bundle(), InFlightClaims.bundle()
    claims.add(SHA, _ref("a"), one, _never)
    claims.add(SHA, _ref("b"), two, _never)
    _, first = claims.seal(Request([_item("a", one)]))
    _, second = claims.seal(Request([_item("b", two)]))
    claims.settle(claims.seal(Request([_item("x", 0)]))[1])   # not claimed: nothing in flight changes
    claims.settle(first)
    got = []
    waiting = threading.Thread(target=lambda: got.append(claims.add(SHA, _ref("c"), claims.bundle(), _never)))
    waiting.start()
    waiting.join(timeout=0.5)
    assert got == []
    claims.settle(second)
    waiting.join(timeout=5)
    assert got == [FIRST]
