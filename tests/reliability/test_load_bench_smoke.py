"""The load benchmark's code path, scaled down (the benchmark itself runs outside the tests)."""

from __future__ import annotations

from bench.load import run_one


def test_the_load_benchmark_counts_every_submission_and_poll() -> None:
    figures = run_one("sqlite", postgres_url="", submitters=5, pollers=2, duration=1.0)
    assert figures["submissions"]["status_counts"] == {"202": 5}
    assert figures["polling"]["requests"] > 0 and figures["polling"]["status_5xx"] == 0
    assert figures["rows"] == {"job_rows": 5, "lost": 0, "unreported_rows": 0, "duplicate_idempotency_keys": 0,
                               "broker_messages": 5, "jobs_without_one_message": 0}
