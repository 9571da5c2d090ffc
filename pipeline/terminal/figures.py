"""Figures for people. Roubles: the service bills to the micro-rouble, which matters below a
rouble (a sandbox run costs 0.245415) and is noise above a hundred."""
from __future__ import annotations


def exact(value: float | None) -> str:
    """To the micro-rouble, without trailing zeros: 0.245415, 1,234.5, 100."""
    if value is None:
        return "?"
    text = f"{value:,.6f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def rub(value: float | None) -> str:
    """Kopecks from 100 RUB up, micro-roubles below."""
    if value is not None and abs(value) >= 100:
        return f"{value:,.2f}"
    return exact(value)


def count(n: int, noun: str) -> str:
    """1 request, 2 requests, 1,234 requests."""
    return f"{n:,} {noun}" + ("" if n == 1 else "s")
