"""The webhook outbox: events written with the state change they report, and their deliveries.

:func:`record_event` is called by the state changes themselves (:mod:`.jobs`, :mod:`.leases`) right
after their conditional ``UPDATE`` succeeded, in the same transaction: the event exists if and only
if the change was committed. It writes one delivery per target (each endpoint of the job's key that
takes this event type, and the job's own ``notify_url``); with no target it writes nothing, so a
service without webhooks keeps no events. The dispatcher (:mod:`app.api.background._dispatcher`) sends the
deliveries; a delivery is claimed with a conditional ``UPDATE`` of its next attempt time, so two API
processes do not send it at once.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from app.core.db._database import utcnow
from app.core.db._models import Job, JobEvent, JobStatus, WebhookAttempt, WebhookDelivery
from app.core.db.repository._rows import rowcount
from app.core.db.repository._webhooks import webhooks_for
from app.core.mlflow_registry import public_registration

SUCCEEDED, FAILED, CANCELLED, STAGE_CHANGED = "job.succeeded", "job.failed", "job.cancelled", "job.stage_changed"
EVENT_TYPES = (SUCCEEDED, FAILED, CANCELLED, STAGE_CHANGED)
#: The event reporting that a job ended with this status.
FINAL_EVENT = {JobStatus.succeeded: SUCCEEDED, JobStatus.failed: FAILED, JobStatus.cancelled: CANCELLED}


def _when(value: dt.datetime | None) -> str | None:
    return None if value is None else value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def job_summary(job: Job, *, details: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What an event says about its job: enough to act on without a second request.

    Besides its state: what the model is (the job's name, the model and dataset by name and reference,
    the settings it was made with, and in ``result`` the base model, warnings and figures) and its MLflow
    registration, and a target run's ``target`` once the run decided it (so the stage changes after it carry
    it too); ``details`` add what only the worker knows at the end (``artifacts`` with their time-limited
    signed links, the run's ``identity`` and ``recipe``, the report's ``target``).
    """
    result = job.result or {}
    return {
        "id": job.id,
        "status": job.status,
        "stage": job.stage,
        "progress": job.progress,
        "name": job.name,
        "model": {"uri": job.model_uri, "revision": job.model_revision,
                  "name": result.get("base_model") or job.model_name},
        "dataset": {"uri": (job.dataset or {}).get("uri"), "name": result.get("dataset") or job.dataset_name},
        "params": job.params,
        "labels": dict(job.labels or {}),
        "error": {"code": job.error_code, "message": job.error_message or ""} if job.error_code else None,
        "result": job.result,
        "warnings": list(result.get("warnings") or []),
        "registration": public_registration(job.registration) if job.registration else None,
        "artifacts": [],
        "identity": None,
        "recipe": None,
        "target": job.target,
        "cahp_version": _cahp_version(),
        "created_at": _when(job.created_at),
        "started_at": _when(job.started_at),
        "finished_at": _when(job.finished_at),
        "url": f"/v1/jobs/{job.id}",
    } | dict(details or {})


def _cahp_version() -> str | None:
    try:
        return metadata.version("cahp")
    except metadata.PackageNotFoundError:
        return None


def record_event(session: Session, *, job_id: str, event_type: str,
                 details: Mapping[str, Any] | None = None) -> JobEvent | None:
    """Write the event and its deliveries, or nothing when no one listens. Call after the change.

    ``details`` (a finished job's artifacts with their signed links, identity and recipe) go into the
    payload's ``data`` as they are.
    """
    job = session.scalar(select(Job).where(Job.id == job_id).execution_options(populate_existing=True))
    if job is None:
        return None
    targets: list[tuple[str | None, str]] = list(webhooks_for(session, owner_id=job.owner_id, event_type=event_type))
    if job.notify_url:
        targets.append((None, job.notify_url))
    if not targets:
        return None
    now = utcnow()
    body = {"type": event_type, "timestamp": _when(now), "data": job_summary(job, details=details)}
    event = JobEvent(webhook_id=f"msg_{uuid.uuid4().hex}", job_id=job_id, type=event_type,
                     payload=json.dumps(body, separators=(",", ":"), sort_keys=True), created_at=now)
    session.add(event)
    session.flush()
    session.add_all(WebhookDelivery(event_id=event.id, job_id=job_id, endpoint_id=endpoint, url=url, status="pending",
                                    attempts=0, next_attempt_at=now, created_at=now) for endpoint, url in targets)
    session.flush()
    return event


@dataclass(frozen=True)
class DueDelivery:
    """A delivery to send now, with everything the send needs (plain values: no session outlives it)."""

    id: int
    url: str
    endpoint_id: str | None
    owner_id: str
    webhook_id: str
    event_type: str
    payload: str
    attempts: int
    created_at: dt.datetime


def due_deliveries(session: Session, *, now: dt.datetime, limit: int = 50,
                   exclude_owners: Sequence[str] = ()) -> list[DueDelivery]:
    """Pending deliveries due by ``now``, longest waiting first, leaving out those of ``exclude_owners``
    (keys the dispatcher already sends as many as it allows for), so they do not fill the batch."""
    query = (
        select(WebhookDelivery.id, WebhookDelivery.url, WebhookDelivery.endpoint_id, Job.owner_id,
               JobEvent.webhook_id, JobEvent.type, JobEvent.payload, WebhookDelivery.attempts,
               WebhookDelivery.created_at)
        .join(JobEvent, JobEvent.id == WebhookDelivery.event_id)
        .join(Job, Job.id == WebhookDelivery.job_id)
        .where(WebhookDelivery.status == "pending", WebhookDelivery.next_attempt_at <= now)
        .order_by(WebhookDelivery.next_attempt_at, WebhookDelivery.id)
        .limit(limit)
    )
    if exclude_owners:
        query = query.where(Job.owner_id.not_in(exclude_owners))
    return [DueDelivery(*row) for row in session.execute(query)]


def claim_delivery(session: Session, *, delivery_id: int, now: dt.datetime, hold_s: float) -> bool:
    """Take the delivery for one send: push its next attempt ``hold_s`` ahead, if it is still due."""
    claimed = session.execute(
        update(WebhookDelivery)
        .where(WebhookDelivery.id == delivery_id, WebhookDelivery.status == "pending",
               WebhookDelivery.next_attempt_at <= now)
        .values(next_attempt_at=now + dt.timedelta(seconds=hold_s))
    )
    return rowcount(claimed) == 1


def record_attempt(
    session: Session,
    *,
    delivery_id: int,
    attempted_at: dt.datetime,
    status_code: int | None,
    error: str | None,
    duration_ms: float,
    outcome: str,
    next_attempt_at: dt.datetime | None = None,
) -> None:
    """Write one attempt and the delivery's new state: ``delivered``, ``failed`` or ``pending`` again."""
    session.add(WebhookAttempt(delivery_id=delivery_id, attempted_at=attempted_at, status_code=status_code,
                               error=error, duration_ms=duration_ms))
    values: dict[str, Any] = {"attempts": WebhookDelivery.attempts + 1, "status": outcome}
    if outcome == "delivered":
        values["delivered_at"] = utcnow()
    elif outcome == "pending":
        assert next_attempt_at is not None
        values["next_attempt_at"] = next_attempt_at
    session.execute(update(WebhookDelivery).where(WebhookDelivery.id == delivery_id).values(**values))
    session.flush()


def job_deliveries(session: Session, *, job_id: str) -> list[tuple[WebhookDelivery, JobEvent, list[WebhookAttempt]]]:
    """Every delivery of the job's events, oldest first, with its event and attempts."""
    rows = session.execute(
        select(WebhookDelivery, JobEvent).join(JobEvent, JobEvent.id == WebhookDelivery.event_id)
        .where(WebhookDelivery.job_id == job_id).order_by(WebhookDelivery.id)
    ).all()
    ids = [delivery.id for delivery, _ in rows]
    attempts: dict[int, list[WebhookAttempt]] = {i: [] for i in ids}
    if ids:
        for attempt in session.scalars(select(WebhookAttempt).where(WebhookAttempt.delivery_id.in_(ids))
                                       .order_by(WebhookAttempt.id)):
            attempts[attempt.delivery_id].append(attempt)
    return [(delivery, event, attempts[delivery.id]) for delivery, event in rows]
