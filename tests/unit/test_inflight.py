"""The library's claims (transforms/dedupe/inflight.py): rows join their own bundle's claim, a
retried bundle is not swallowed by the claims of the attempt that failed, and a row whose text
is in flight waits for the answer, then takes it from the store."""
from __future__ import annotations

import threading
import time

from transforms.dedupe.inflight import FIRST, JOINED, STORED_ALREADY, InFlightClaims
from transforms.records import ChunkRef, TextItem
from transforms.worker.keyindex import key16

SHA = "ab" * 32
WAIT_S = 5.0   # a row waits at most this long in these tests (a request takes a moment)


def _ref(doc: str) -> ChunkRef:
    return ChunkRef(doc, 0, 1, 0, 3, 3, ())


def _never(key):
    return False


def test_rows_join_their_bundles_claim_and_a_retried_bundle_claims_again():
    claims, failed, retry = InFlightClaims(WAIT_S), object(), object()
    assert claims.add(SHA, _ref("a"), failed, _never) == FIRST
    assert claims.add(SHA, _ref("b"), failed, _never) == JOINED
    # the bundle failed before its request left; the runner's retry of it claims anew
    assert claims.add(SHA, _ref("a"), retry, _never) == FIRST
    assert claims.add(SHA, _ref("b"), retry, _never) == JOINED
    sealed = claims.seal(TextItem(SHA, "text", 3, (_ref("a"),)))
    assert [r.doc_id for r in sealed.refs] == ["a", "b"]


def test_a_row_whose_text_is_in_flight_waits_for_the_answer():
    claims, bundle, paid = InFlightClaims(WAIT_S), object(), set()   # of key16s
    assert claims.add(SHA, _ref("a"), bundle, paid.__contains__) == FIRST
    item = claims.seal(TextItem(SHA, "text", 3, (_ref("a"),)))
    got = []
    waiting = threading.Thread(target=lambda: got.append(claims.add(SHA, _ref("c"), object(), paid.__contains__)))
    waiting.start()
    time.sleep(0.2)
    assert got == []                 # the answer is not in yet
    paid.add(key16(SHA))             # the store holds it...
    claims.settle([item])            # ...and the request is over
    waiting.join(timeout=5)
    assert got == [STORED_ALREADY]


def test_a_text_whose_request_ended_without_a_vector_is_claimed_again():
    claims = InFlightClaims(WAIT_S)
    claims.add(SHA, _ref("a"), object(), _never)
    claims.settle([claims.seal(TextItem(SHA, "text", 3, (_ref("a"),)))])
    assert claims.add(SHA, _ref("b"), object(), _never) == FIRST
