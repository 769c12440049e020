"""``GET /metrics`` in the Prometheus text format, and the request-latency middleware feeding it.

The route needs no API key, like ``/healthz``: it tells job counts and timings, never a job's inputs
or anyone's key. Expose it only where your Prometheus scrapes from (docs/operations.md).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.db import Job, JobStatus, WebhookDelivery, utcnow
from app.core.metrics import HTTP_LATENCY, http_labels, process_registry

router = APIRouter(include_in_schema=False)


class MetricsMiddleware:
    """Times every HTTP request by method, route template (``/v1/jobs/{job_id}``) and status.

    The labels come from :func:`app.core.metrics.http_labels`, so no request can add a series.

    A plain ASGI middleware: no extra task or body buffering per request. Event streams are not
    timed (their duration is how long the client listened, not how fast the API answered).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = getattr(scope.get("route"), "path", None)
            if not (route or "").endswith("/events"):
                HTTP_LATENCY.labels(*http_labels(scope["method"], route, status)).observe(time.perf_counter() - start)


class DatabaseCollector(Collector):
    """Deployment-wide gauges, read from the job database at each scrape."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    def describe(self) -> list[Any]:
        return []  # no collect() at registration time

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._sessions() as session:
            counts = dict(session.execute(select(Job.status, func.count()).group_by(Job.status)).all())
            oldest = session.scalar(select(func.min(Job.created_at)).where(Job.status == JobStatus.queued.value))
            pending = session.scalar(select(func.count()).select_from(WebhookDelivery)
                                     .where(WebhookDelivery.status == "pending"))
        jobs = GaugeMetricFamily("cahp_jobs", "Jobs in the database, by status", labels=["status"])
        for status in JobStatus:
            jobs.add_metric([status.value], counts.get(status.value, 0))
        yield jobs
        age = 0.0 if oldest is None else (utcnow() - _aware(oldest)).total_seconds()
        yield GaugeMetricFamily("cahp_queue_oldest_job_age_seconds",
                                "Age of the oldest queued job (0 when none is queued)", value=max(0.0, age))
        yield GaugeMetricFamily("cahp_webhook_deliveries_pending", "Webhook deliveries waiting to be sent",
                                value=pending or 0)


def _aware(value: dt.datetime) -> dt.datetime:
    # min() over a UTCDateTime column skips the type's processing on SQLite: the value comes back naive.
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)


def database_registry(sessions: sessionmaker[Session]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector(sessions))
    return registry


class LocalWorkerCollector(Collector):
    """The workers this server started itself (embedded mode): how many run, how many were replaced."""

    def __init__(self, workers: Any) -> None:
        self._workers = workers

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        yield GaugeMetricFamily("cahp_local_workers", "Workers started by this server that are running now",
                                value=self._workers.alive())
        yield GaugeMetricFamily("cahp_local_workers_expected", "Workers this server keeps running",
                                value=self._workers.expected)
        yield CounterMetricFamily("cahp_local_worker_restarts", "Workers this server started in place of one "
                                  "that exited", value=self._workers.restarts)


@router.get("/metrics")
def metrics(request: Request) -> Response:
    """Every ``cahp_*`` metric of this host's processes, the database gauges and this server's own workers."""
    body = generate_latest(process_registry()) + generate_latest(request.app.state.metrics_registry)
    workers = getattr(request.app.state, "local_workers", None)
    if workers is not None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(LocalWorkerCollector(workers))
        body += generate_latest(registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
