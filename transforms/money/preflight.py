"""Preflight: does the whole run fit the spendable amount? The same worst-case arithmetic as
the budget guard, request by request, so a cap the preflight accepts is not refused later.

Two answers, the cheap one first: an upper bound from the input's text bytes (a cl100k token
is at least one UTF-8 byte), which needs no tokenising; and, only when the bound does not fit,
the exact worst case of the packed requests (WorstCaseMicro), which needs the whole corpus split.
"""
from __future__ import annotations

import apache_beam as beam

from transforms.money.apportion import to_micro
from transforms.money.budget import worst_case_micro


class WorstCaseMicro(beam.PTransform):
    """Packed requests -> one number: Σ worst-case cost of every request, in micro-roubles."""

    def __init__(self, price_per_token_rub: float, margin: float):
        super().__init__()
        self._price, self._margin = price_per_token_rub, margin

    def expand(self, requests):
        price, margin = self._price, self._margin
        return (requests
                | "WorstCase" >> beam.Map(lambda r: worst_case_micro(sum(i.n_tokens for i in r), price, margin))
                | "Sum" >> beam.CombineGlobally(sum))


def bound_worst_case_micro(text_bytes: int, documents: int, chunk_tokens: int, overlap_tokens: int,
                           price_per_token_rub: float, margin: float) -> int:
    """An upper bound of WorstCaseMicro from bytes alone. Tokens <= bytes; each chunk after a
    document's first repeats at most `overlap_tokens`; each request's worst case is rounded up
    by less than one micro-rouble, and there are no more requests than chunks."""
    chunks = documents + text_bytes // max(1, chunk_tokens - overlap_tokens) + 1
    tokens = text_bytes + overlap_tokens * chunks
    return worst_case_micro(tokens, price_per_token_rub, margin) + chunks


def fits(worst_case_micro_total: int, spendable_rub: float | None) -> bool:
    return spendable_rub is None or worst_case_micro_total <= to_micro(spendable_rub)
