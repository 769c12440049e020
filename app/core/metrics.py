"""The service's Prometheus metrics, every one named ``cahp_*``, shared by the API and the workers.

Processes. ``cahp serve`` and ``cahp worker --metrics-port`` (or ``CAHP_WORKER_METRICS_PORT``) run
prometheus-client in multiprocess mode: every process of the deployment on one host (the API, the
workers ``cahp serve`` starts, a worker's Celery pool processes) writes its samples to files in one
directory, and the process serving ``/metrics`` adds them up. :func:`app.core.metrics_dir.use_directory`
must therefore run before anything imports ``prometheus_client``; the commands call it first. Without
it (tests, a library user) the metrics live in the process's default registry.

Labels. Every label value comes from a set fixed by the code, never from a request as sent (see
:func:`http_labels`): stages are the engine's, error codes are the exception classes' ``code``,
statuses and outcomes are enumerations. A client that could choose a label value could grow every
scrape and every process's file without bound.

Gauges that describe the whole deployment (jobs by status, the age of the oldest queued job,
pending webhook deliveries) are read from the database when scraped (:mod:`app.api.metrics`), so
they are right however many processes write jobs.
"""

from __future__ import annotations

import datetime as dt
import os

from prometheus_client import CollectorRegistry, Counter, Histogram

from app.core.metrics_dir import MULTIPROCESS_ENV

#: Seconds, for request latency: 1 ms to 10 s.
_FAST = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: Seconds, for queue waits and stages: 1 s to a day.
_SLOW = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 3 * 3600.0, 6 * 3600.0, 24 * 3600.0)

#: The service's own metrics only (not the client library's process_* and python_* ones: every
#: metric exposed is a cahp_* one).
REGISTRY = CollectorRegistry()

#: The methods ``cahp_http_request_duration_seconds`` names; any other is counted as ``other``.
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

HTTP_LATENCY = Histogram("cahp_http_request_duration_seconds",
                         "Time to answer an API request, by method, route template and status code",
                         ["method", "route", "status"], buckets=_FAST, registry=REGISTRY)
QUEUE_WAIT = Histogram("cahp_job_queue_wait_seconds", "Time from a job's submission to a worker starting it",
                       buckets=_SLOW, registry=REGISTRY)
STAGE_DURATION = Histogram("cahp_job_stage_duration_seconds", "Time a job spent in each stage of the pipeline",
                           ["stage"], buckets=_SLOW, registry=REGISTRY)
JOBS_SUBMITTED = Counter("cahp_jobs_submitted_total",
                         "Jobs created by POST /v1/jobs (a submit answered with an earlier job is not counted)",
                         registry=REGISTRY)
JOB_DURATION = Histogram("cahp_job_duration_seconds",
                         "Time from a job's submission to its end, every attempt and wait included, by final status",
                         ["status"], buckets=_SLOW, registry=REGISTRY)
JOBS_FINISHED = Counter("cahp_jobs_finished_total", "Jobs that ended, by final status", ["status"], registry=REGISTRY)
JOB_FAILURES = Counter("cahp_job_failures_total", "Failed jobs, by error code", ["code"], registry=REGISTRY)
LEASE_TAKEOVERS = Counter("cahp_lease_takeovers_total",
                          "Running jobs whose worker stopped renewing its lease, by what became of them",
                          ["outcome"], registry=REGISTRY)
WEBHOOK_DELIVERIES = Counter("cahp_webhook_deliveries_total",
                             "Webhook delivery attempts, by outcome (delivered, retry, failed)", ["outcome"],
                             registry=REGISTRY)


def http_labels(method: str, route: str | None, status: int) -> tuple[str, str, str]:
    """The ``method``, ``route`` and ``status`` labels of one request, each from a bounded set.

    Every label value becomes a series in every process's file and in each scrape, so none may come
    from the client as sent: an invented method is ``other``, a path no route matched is
    ``unmatched`` (the route label is the route's template, never the path), and a status outside
    100-599 is ``other``.
    """
    return (method if method in HTTP_METHODS else "other", route or "unmatched",
            str(status) if 100 <= status <= 599 else "other")


def process_registry() -> CollectorRegistry:
    """The registry to expose: every process's samples in multiprocess mode, else this process's."""
    from prometheus_client.multiprocess import MultiProcessCollector

    if not os.environ.get(MULTIPROCESS_ENV):
        return REGISTRY
    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    return registry


def serve(port: int, *, host: str = "0.0.0.0") -> None:
    """Serve :func:`process_registry` on ``http://host:port/metrics`` from a daemon thread."""
    from prometheus_client import start_http_server

    start_http_server(port, addr=host, registry=process_registry())


def observe_job_end(status: str, created_at: dt.datetime | None) -> None:
    """``cahp_job_duration_seconds`` for a job that just ended, from its submission to now."""
    if created_at is None:
        return
    created = created_at if created_at.tzinfo else created_at.replace(tzinfo=dt.UTC)
    JOB_DURATION.labels(status).observe(max(0.0, (dt.datetime.now(dt.UTC) - created).total_seconds()))
