"""Jobs: insert, read, list, cancel, delete, and the marks of what was sent to the broker."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Row, and_, bindparam, delete, exists, or_, select, update
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import Session

from app.core.db._database import utcnow
from app.core.db._models import Job, JobLabel, JobStatus
from app.core.db.repository._events import CANCELLED, record_event
from app.core.db.repository._rows import rowcount


def add_job(session: Session, job: Job) -> Job:
    """Insert a job and its label rows; raises ``IntegrityError`` when its (owner, idempotency key) exists."""
    session.add(job)
    session.flush()
    session.add_all(JobLabel(job_id=job.id, key=key, value=value) for key, value in (job.labels or {}).items())
    session.flush()
    return job


def delete_job(session: Session, *, job_id: str) -> None:
    session.execute(delete(Job).where(Job.id == job_id))


def delete_finished_job(session: Session, *, job_id: str, owner_id: str) -> bool:
    """Delete a finished job with its logs, labels, artifact rows and events; False when it is not finished.

    Conditional on the status, so a job cannot be deleted under a worker that is running it.
    """
    finished = [status.value for status in JobStatus if status.finished]
    deleted = session.execute(delete(Job).where(Job.id == job_id, Job.owner_id == owner_id,
                                                Job.status.in_(finished)))
    return rowcount(deleted) == 1


def get_job(session: Session, *, job_id: str, owner_id: str | None = None) -> Job | None:
    """The job, or None; with ``owner_id``, None also when another key owns it."""
    query = select(Job).where(Job.id == job_id)
    if owner_id is not None:
        query = query.where(Job.owner_id == owner_id)
    return session.scalar(query.execution_options(populate_existing=True))


_JOBS = Job.__table__
#: Built once: making a statement costs more than running this one on SQLite.
_JOB_ROW = select(_JOBS).where(_JOBS.c.id == bindparam("job_id"), _JOBS.c.owner_id == bindparam("owner_id"))


def job_row(connection: Connection | Session, *, job_id: str, owner_id: str) -> Row[Any] | None:
    """The job's columns as a plain row, no ORM object: the status poll's read, at a quarter of the cost.

    Takes a bare ``Connection`` too: the poll needs no session (one less object and transaction).
    """
    return connection.execute(_JOB_ROW, {"job_id": job_id, "owner_id": owner_id}).first()


def job_row_sql(dialect: Dialect) -> str:
    """:func:`job_row`'s statement as SQL text for ``dialect``, with ``job_id`` and ``owner_id``
    parameters: for a driver used directly (the PostgreSQL status poll, :mod:`app.api.job_reader`)."""
    return str(_JOB_ROW.compile(dialect=dialect))


def find_job_by_idempotency_key(session: Session, *, owner_id: str, key: str) -> Job | None:
    return session.scalar(select(Job).where(Job.owner_id == owner_id, Job.idempotency_key == key))


def list_jobs(
    session: Session,
    *,
    owner_id: str,
    limit: int,
    status: JobStatus | None = None,
    before: tuple[dt.datetime, str] | None = None,
    labels: Sequence[tuple[str, str]] = (),
) -> list[Job]:
    """Newest first; ``before`` is the (created_at, id) of the last job of the previous page.

    ``labels``: only jobs carrying every one of these ``(key, value)`` labels.
    """
    query = select(Job).where(Job.owner_id == owner_id)
    if status is not None:
        query = query.where(Job.status == status.value)
    for key, value in labels:
        query = query.where(exists().where(JobLabel.job_id == Job.id, JobLabel.key == key, JobLabel.value == value))
    if before is not None:
        created, job_id = before
        query = query.where(or_(Job.created_at < created, and_(Job.created_at == created, Job.id < job_id)))
    query = query.order_by(Job.created_at.desc(), Job.id.desc()).limit(limit)
    return list(session.scalars(query))


def request_cancel(session: Session, *, job_id: str, owner_id: str) -> None:
    """Cancel a queued job at once; flag a running one for its worker to stop between steps."""
    now = utcnow()
    cancelled = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.owner_id == owner_id, Job.status == JobStatus.queued.value)
        .values(status=JobStatus.cancelled.value, cancel_requested=True, finished_at=now, updated_at=now,
                error_code="cancelled", error_message="cancelled before it started")
    )
    if rowcount(cancelled) == 1:
        record_event(session, job_id=job_id, event_type=CANCELLED)
    session.execute(
        update(Job)
        .where(Job.id == job_id, Job.owner_id == owner_id, Job.status == JobStatus.running.value)
        .values(cancel_requested=True, updated_at=now)
    )


def cancel_key_jobs(session: Session, *, owner_id: str) -> tuple[int, int]:
    """End every queued job of a revoked key and ask its running ones to stop: ``(cancelled, stopping)``.

    Each queued job is ended by :func:`request_cancel`'s conditional ``UPDATE``, so a job a worker
    claims meanwhile is asked to stop instead, and counted there.
    """
    queued = list(session.scalars(select(Job.id).where(Job.owner_id == owner_id,
                                                       Job.status == JobStatus.queued.value)))
    now = utcnow()
    cancelled = 0
    for job_id in queued:
        done = session.execute(
            update(Job).where(Job.id == job_id, Job.status == JobStatus.queued.value)
            .values(status=JobStatus.cancelled.value, cancel_requested=True, finished_at=now, updated_at=now,
                    error_code="cancelled", error_message="cancelled before it started: its API key was revoked"))
        if rowcount(done) == 1:
            cancelled += 1
            record_event(session, job_id=job_id, event_type=CANCELLED)
    stopping = session.execute(
        update(Job).where(Job.owner_id == owner_id, Job.status == JobStatus.running.value)
        .values(cancel_requested=True, updated_at=now))
    return cancelled, rowcount(stopping)


def queued_jobs_to_send(session: Session, *, sent_before: dt.datetime, limit: int = 500) -> list[tuple[str, bool]]:
    """Queued jobs never sent, or last sent before ``sent_before``: ``(id, ever_sent)``, oldest first."""
    query = (
        select(Job.id, Job.enqueued_at)
        .where(Job.status == JobStatus.queued.value,
               or_(Job.enqueued_at.is_(None), Job.enqueued_at < sent_before))
        .order_by(Job.created_at)
        .limit(limit)
    )
    return [(row.id, row.enqueued_at is not None) for row in session.execute(query)]


def mark_enqueued(session: Session, *, job_id: str, sent_before: dt.datetime | None = None) -> bool:
    """Note that the job is being sent now; with ``sent_before``, only if no one sent it since.

    The condition makes concurrent sweepers (several API replicas) send a lost job once.
    """
    query = update(Job).where(Job.id == job_id, Job.status == JobStatus.queued.value)
    if sent_before is not None:
        query = query.where(or_(Job.enqueued_at.is_(None), Job.enqueued_at < sent_before))
    return rowcount(session.execute(query.values(enqueued_at=utcnow()))) == 1


def mark_not_enqueued(session: Session, *, job_id: str) -> None:
    """The send failed: leave the job for the next sweep to send."""
    session.execute(update(Job).where(Job.id == job_id, Job.status == JobStatus.queued.value)
                    .values(enqueued_at=None))


def set_registration(session: Session, *, job_id: str, registration: dict[str, Any]) -> None:
    """Record how the job's latest MLflow registration went, after the ones before it.

    The row is locked for the read (``FOR UPDATE``; SQLite has one writer at a time), so that two
    registrations of one job at once each keep their entry.
    """
    row = session.execute(select(Job.registration, Job.registration_history).where(Job.id == job_id)
                          .with_for_update()).one_or_none()
    if row is None:
        return
    history = registrations_of(row.registration, row.registration_history)
    session.execute(update(Job).where(Job.id == job_id).values(
        registration=registration, registration_history=[*history, registration], updated_at=utcnow()))


def registrations_of(last: dict[str, Any] | None, history: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """A job's registrations, oldest first, from its ``registration`` and ``registration_history`` columns."""
    if history is not None:
        return list(history)
    return [last] if last else []


def reserve_registration(session: Session, *, job_id: str, limit: int) -> bool:
    """Count one more registration of the job, unless it had ``limit`` already; whether it was counted.

    One conditional ``UPDATE``: of concurrent registrations at the limit, only those it leaves room for count.
    """
    counted = session.execute(update(Job).where(Job.id == job_id, Job.registrations < limit)
                              .values(registrations=Job.registrations + 1))
    return rowcount(counted) == 1
