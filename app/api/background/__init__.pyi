"""The API process's background loops, beside its HTTP side: what runs without a request.

Reading order: ``_producer`` (``JobQueue``: sends a job's task by name) -> ``_broker_probe`` (which jobs
wait in the broker) -> ``_sweeper`` (re-sends jobs the broker lost, fails expired leases, expires
artifacts) -> ``_dispatcher`` with ``_webhook_http`` (webhook deliveries from the outbox, through the
outbound guard)."""

from ._broker_probe import job_id_of, waiting_job_ids
from ._dispatcher import (
    BATCH,
    CLAIM_MARGIN_S,
    USER_AGENT,
    Attempt,
    Claimed,
    WebhookDispatcher,
    backoff_s,
    claim_due,
    deliver,
    dispatch_once,
    send,
)
from ._producer import JobQueue
from ._sweeper import Sweeper, SweepReport, sweep_once
from ._webhook_http import WRITE_CHUNK, GuardedBackend, deadline, webhook_client

__all__ = [
    "Attempt", "backoff_s", "BATCH", "claim_due", "CLAIM_MARGIN_S", "Claimed", "deadline", "deliver",
    "dispatch_once", "GuardedBackend", "job_id_of", "JobQueue", "send", "sweep_once", "Sweeper", "SweepReport",
    "USER_AGENT", "waiting_job_ids", "webhook_client", "WebhookDispatcher", "WRITE_CHUNK",
]
