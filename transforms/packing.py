"""Token-aware request packing: streaming first-fit over a bounded set of open requests.

A request closes as soon as it is `fill_target` full by tokens or holds `max_inputs` items;
when more than `max_open_bins` are open, the fullest one is sent. Memory stays bounded, no
request is ever empty or over a cap, and an item larger than `max_tokens` travels alone
(the service's answer then decides: an over-length 400 is re-split by the caller).
"""
from __future__ import annotations

from typing import Any


class _Bin:
    __slots__ = ("items", "tokens")

    def __init__(self):
        self.items: list[Any] = []
        self.tokens = 0


class Packer:
    def __init__(self, max_inputs: int, max_tokens: int, fill_target: float = 0.95, max_open_bins: int = 16):
        if max_inputs < 1 or max_tokens < 1 or not 0 < fill_target <= 1 or max_open_bins < 1:
            raise ValueError("packing limits must be positive and fill_target in (0, 1]")
        self._max_inputs, self._max_tokens = max_inputs, max_tokens
        self._full_tokens = fill_target * max_tokens
        self._max_open = max_open_bins
        self._open: list[_Bin] = []

    def _is_full(self, b: _Bin) -> bool:
        return len(b.items) >= self._max_inputs or b.tokens >= self._full_tokens

    def add(self, item: Any, n_tokens: int) -> list[list[Any]]:
        if n_tokens >= self._max_tokens:
            return [[item]]
        target = next((b for b in self._open if len(b.items) < self._max_inputs
                       and b.tokens + n_tokens <= self._max_tokens), None)
        if target is None:
            target = _Bin()
            self._open.append(target)
        target.items.append(item)
        target.tokens += n_tokens
        closed = []
        if self._is_full(target):
            self._open.remove(target)
            closed.append(target.items)
        if len(self._open) > self._max_open:
            fullest = max(self._open, key=lambda b: (b.tokens / self._max_tokens, len(b.items) / self._max_inputs))
            self._open.remove(fullest)
            closed.append(fullest.items)
        return closed

    def flush(self) -> list[list[Any]]:
        closed = [b.items for b in self._open if b.items]
        self._open = []
        return closed
