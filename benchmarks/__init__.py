"""Benchmarks: `make bench` (benchmarks/bench.py) and the older single-purpose scripts."""
