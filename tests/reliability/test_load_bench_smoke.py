"""The load benchmark's code path, scaled down (the benchmark itself runs outside the tests)."""

from __future__ import annotations

import shutil

from bench.load import PollCost, run_one


def test_the_load_benchmark_counts_every_submission_and_poll() -> None:
    # wrk runs only where it is installed (the benchmark's set-up installs it; the tests do not).
    cost = PollCost(wrk_runs=1 if shutil.which("wrk") else 0, wrk_duration_s=1.0, paced_rate=20.0,
                    paced_duration_s=1.0)
    figures = run_one("sqlite", postgres_url="", submitters=5, pollers=2, duration=1.0, cost=cost)
    assert figures["submissions"]["status_counts"] == {"202": 5}
    assert figures["polling"]["requests"] > 0 and figures["polling"]["status_5xx"] == 0
    assert figures["rows"] == {"job_rows": 5, "lost": 0, "unreported_rows": 0, "duplicate_idempotency_keys": 0,
                               "broker_messages": 5, "jobs_without_one_message": 0}
    paced = figures["poll_cost"]["paced"]
    assert paced["requests"] == 20 and paced["non_2xx"] == 0 and paced["transport_errors"] == 0
    if cost.wrk_runs:
        saturation = figures["poll_cost"]["saturation"]
        assert saturation["errors"] == 0 and saturation["status_per_s"] > 0 and saturation["healthz_per_s"] > 0
