"""Benchmarks: they print and save figures; they are never part of the pass/fail test run."""
