"""Benchmarks: repeatable measurements that print and save figures under bench/results/; never pass/fail,
never part of the test run."""
