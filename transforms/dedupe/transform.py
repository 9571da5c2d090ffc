"""Dedupe: each distinct chunk text of the run is sent once, for every row that uses it, and
not at all when a store has paid for it already (DIR's history, killed runs' journals, --known).

One step, two ways; STREAMING chooses (pipeline/graph.py `streams`: the local runner, without
--doc-vectors):
- grouping: a GroupByKey on text_sha256 and a CoGroupByKey with the stores' digests. Exact on
  any number of workers; the shuffle spreads the Embed step over them by text hash.
- streaming: a text's first row claims it and later rows join the claim until its request
  leaves (`seal`); the stores' digests are indexed in the process. Nothing crosses a stage
  boundary, so texts stream from Read to Write in flat memory. Several worker processes claim
  through a file they share (SHARED, distinct.py).
"""
from __future__ import annotations

import apache_beam as beam

from transforms.dedupe.claimfile import ClaimFile
from transforms.dedupe.distinct import GroupDistinctTexts, SealClaims, SealReused, StreamDistinctTexts
from transforms.dedupe.known import REUSED, AntiJoinKnown, KnownStores, ReuseKnownStream

ITEMS = "items"


class Dedupe(beam.PTransform):
    """(text_sha256, (text, n_tokens, ChunkRef)) -> `items`: a TextItem per distinct text to
    send; `reused` (only when a store holds texts): (TextItem, ReuseRef) per text paid for
    already. KNOWN is where those stores are; SCOPE names the in-process claims and index
    (the run id, or another for a counting pipeline); SHARED, the claim file of the local
    runner's worker processes, when streaming with several."""

    def __init__(self, known: KnownStores, scope: str, streaming: bool, shared: ClaimFile | None = None):
        super().__init__()
        self._known, self._scope, self._streaming, self._shared = known, scope, streaming, shared

    def expand(self, entries):
        stream = self._streaming
        items = entries | "Distinct" >> (StreamDistinctTexts(self._scope, self._shared) if stream
                                         else GroupDistinctTexts())
        if not self._known.any:
            return {ITEMS: items}
        joined = items | "ReuseKnown" >> (ReuseKnownStream(self._known) if stream else AntiJoinKnown(self._known))
        reused = joined[REUSED] | "SealReused" >> SealReused(self._scope, self._shared) if stream else joined[REUSED]
        return {ITEMS: joined[ITEMS], REUSED: reused}

    def seal(self) -> beam.PTransform:
        """Packed requests -> the same, each text with every row that claimed it before its
        request left. Grouped texts carry all their rows already: the requests pass as they are."""
        return SealClaims(self._scope if self._streaming else None, self._shared)
