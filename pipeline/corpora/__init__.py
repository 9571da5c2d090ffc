"""Corpora that ship offline: the demo's and the benchmarks'."""
