"""Benchmarks: what the operator adds on top of the model's latency, and how it scales.

Run with ``make bench`` (or ``python -m bench``); the table goes to stdout and ``bench/RESULTS.md``.
Every figure is a median over repeated runs, and every ratio is measured side by side in one process run,
so machine noise hits numerator and denominator alike.
"""
