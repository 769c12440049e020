"""The API process's background loops, beside its HTTP side: what runs without a request.

Reading order: ``_producer`` (``JobQueue``: sends a job's task by name) -> ``_broker_probe`` (which jobs
wait in the broker) -> ``_sweeper`` (re-sends jobs the broker lost, fails expired leases, expires
artifacts) -> ``_dispatcher`` with ``_webhook_http`` (webhook deliveries from the outbox, through the
outbound guard)."""

from ._broker_probe import job_id_of, waiting_job_ids
from ._dispatcher import WebhookDispatcher, backoff_s, dispatch_once
from ._producer import JobQueue
from ._sweeper import Sweeper, SweepReport, sweep_once

__all__ = [
    "backoff_s", "dispatch_once", "job_id_of", "JobQueue", "sweep_once", "Sweeper", "SweepReport",
    "waiting_job_ids", "WebhookDispatcher",
]
