"""Preflight: does the whole run fit the spendable amount? The same worst-case arithmetic as
the budget guard, request by request, so a cap the preflight accepts is not refused later."""
from __future__ import annotations

import apache_beam as beam

from transforms.apportion import to_micro
from transforms.budget import worst_case_micro


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


def fits(worst_case_micro_total: int, spendable_rub: float | None) -> bool:
    return spendable_rub is None or worst_case_micro_total <= to_micro(spendable_rub)
