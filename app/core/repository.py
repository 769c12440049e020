"""Every read and write of the job database, as plain functions over a session.

The API's services and the worker both go through here, so each state change of a job is one
conditional ``UPDATE`` in one place: a transition happens only from the state it starts from
(``WHERE status = 'queued'``...), which is what makes two workers, a worker and a cancel request, or
a worker and the sweeper safe to race. A running job is held by one worker under a lease that the
worker renews; only the holder may write its progress, logs and end, and once the lease has expired
the job may be taken over. Functions never commit; the caller owns the transaction.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, delete, func, or_, select, update
from sqlalchemy.orm import Session

from app.core.db import utcnow
from app.core.models import ApiKey, Artifact, Job, JobLog, JobStatus, Upload
from app.core.security import LOCAL_PRINCIPAL_ID, hash_key
from app.core.settings import DEFAULT_LEASE_S, DEFAULT_MAX_ATTEMPTS

# --- API keys ---------------------------------------------------------------------------------------


def add_api_key(session: Session, *, key_id: str, name: str, key_hash: str) -> ApiKey:
    row = ApiKey(id=key_id, name=name, key_hash=key_hash)
    session.add(row)
    session.flush()
    return row


def get_api_key(session: Session, *, key_id: str) -> ApiKey | None:
    return session.get(ApiKey, key_id)


def list_api_keys(session: Session) -> list[ApiKey]:
    """Every key but the ``--no-auth`` principal, oldest first."""
    query = select(ApiKey).where(ApiKey.id != LOCAL_PRINCIPAL_ID).order_by(ApiKey.created_at, ApiKey.id)
    return list(session.scalars(query))


def revoke_api_key(session: Session, *, key_id: str) -> bool:
    """Mark the key revoked; False when it was already revoked (the first revocation time stays)."""
    result = session.execute(
        update(ApiKey).where(ApiKey.id == key_id, ApiKey.revoked_at.is_(None)).values(revoked_at=utcnow())
    )
    return _rowcount(result) == 1


def touch_api_key(session: Session, *, key_id: str, now: dt.datetime, every_s: float) -> None:
    """Record a use of the key, unless one was recorded less than ``every_s`` ago.

    Conditional, so concurrent requests write at most one row version per interval.
    """
    stale = now - dt.timedelta(seconds=every_s)
    session.execute(
        update(ApiKey)
        .where(ApiKey.id == key_id, or_(ApiKey.last_used_at.is_(None), ApiKey.last_used_at < stale))
        .values(last_used_at=now)
    )


def ensure_local_principal(session: Session) -> ApiKey:
    """The owner used by ``--no-auth`` servers; its stored hash matches no key anyone holds."""
    row = session.get(ApiKey, LOCAL_PRINCIPAL_ID)
    if row is None:
        row = add_api_key(session, key_id=LOCAL_PRINCIPAL_ID, name="local (no-auth)",
                          key_hash=hash_key(f"no key is {LOCAL_PRINCIPAL_ID}"))
    return row


# --- uploads ----------------------------------------------------------------------------------------


def add_upload(session: Session, upload: Upload) -> Upload:
    """Record an upload; it stays invisible until :func:`complete_upload` (its object is not stored yet)."""
    session.add(upload)
    session.flush()
    return upload


def complete_upload(session: Session, *, upload_id: str) -> None:
    session.execute(update(Upload).where(Upload.id == upload_id).values(completed_at=utcnow()))


def get_upload(session: Session, *, upload_id: str, owner_id: str) -> Upload | None:
    """A complete upload of ``owner_id``, or None."""
    return session.scalar(select(Upload).where(Upload.id == upload_id, Upload.owner_id == owner_id,
                                               Upload.completed_at.is_not(None)))


def stale_uploads(session: Session, *, started_before: dt.datetime, limit: int = 100) -> list[Upload]:
    """Uploads recorded before ``started_before`` and never completed: their API process died."""
    query = select(Upload).where(Upload.completed_at.is_(None), Upload.created_at < started_before)
    return list(session.scalars(query.order_by(Upload.created_at).limit(limit)))


def delete_upload(session: Session, *, upload_id: str) -> None:
    session.execute(delete(Upload).where(Upload.id == upload_id))


# --- jobs -------------------------------------------------------------------------------------------


def add_job(session: Session, job: Job) -> Job:
    """Insert a job; raises ``IntegrityError`` when its (owner, idempotency key) already exists."""
    session.add(job)
    session.flush()
    return job


def delete_job(session: Session, *, job_id: str) -> None:
    session.execute(delete(Job).where(Job.id == job_id))


def get_job(session: Session, *, job_id: str, owner_id: str | None = None) -> Job | None:
    """The job, or None; with ``owner_id``, None also when another key owns it."""
    query = select(Job).where(Job.id == job_id)
    if owner_id is not None:
        query = query.where(Job.owner_id == owner_id)
    return session.scalar(query.execution_options(populate_existing=True))


def find_job_by_idempotency_key(session: Session, *, owner_id: str, key: str) -> Job | None:
    return session.scalar(select(Job).where(Job.owner_id == owner_id, Job.idempotency_key == key))


def list_jobs(
    session: Session,
    *,
    owner_id: str,
    limit: int,
    status: JobStatus | None = None,
    before: tuple[dt.datetime, str] | None = None,
) -> list[Job]:
    """Newest first; ``before`` is the (created_at, id) of the last job of the previous page."""
    query = select(Job).where(Job.owner_id == owner_id)
    if status is not None:
        query = query.where(Job.status == status.value)
    if before is not None:
        created, job_id = before
        query = query.where(or_(Job.created_at < created, and_(Job.created_at == created, Job.id < job_id)))
    query = query.order_by(Job.created_at.desc(), Job.id.desc()).limit(limit)
    return list(session.scalars(query))


def request_cancel(session: Session, *, job_id: str, owner_id: str) -> None:
    """Cancel a queued job at once; flag a running one for its worker to stop between steps."""
    now = utcnow()
    session.execute(
        update(Job)
        .where(Job.id == job_id, Job.owner_id == owner_id, Job.status == JobStatus.queued.value)
        .values(status=JobStatus.cancelled.value, cancel_requested=True, finished_at=now, updated_at=now,
                error_code="cancelled", error_message="cancelled before it started")
    )
    session.execute(
        update(Job)
        .where(Job.id == job_id, Job.owner_id == owner_id, Job.status == JobStatus.running.value)
        .values(cancel_requested=True, updated_at=now)
    )


def _lease_expired(now: dt.datetime) -> Any:
    # A running row without a lease comes from before leases existed; it counts as expired.
    return or_(Job.lease_expires_at.is_(None), Job.lease_expires_at < now)


def claim_job(
    session: Session,
    *,
    job_id: str,
    worker_id: str,
    lease_s: float = DEFAULT_LEASE_S,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
) -> Job | None:
    """Start an attempt at the job for ``worker_id``, holding it for ``lease_s`` seconds.

    A job can be claimed when it is ``queued``, or ``running`` under a lease that has expired (its
    worker died or lost the database) and was not asked to cancel, and it has attempts left. Only
    one of several concurrent claims can succeed: the ``UPDATE`` is conditional. None otherwise.
    """
    now = utcnow()
    takeable = or_(
        Job.status == JobStatus.queued.value,
        and_(Job.status == JobStatus.running.value, _lease_expired(now), Job.cancel_requested.is_(False)),
    )
    claimed = session.execute(
        update(Job)
        .where(Job.id == job_id, takeable, Job.attempts < max_attempts)
        .values(status=JobStatus.running.value, worker_id=worker_id, attempts=Job.attempts + 1,
                lease_expires_at=now + dt.timedelta(seconds=lease_s), started_at=now, updated_at=now,
                stage=None, progress=0.0)
    )
    if _rowcount(claimed) != 1:
        return None
    return get_job(session, job_id=job_id)


def renew_lease(session: Session, *, job_id: str, worker_id: str, lease_s: float) -> bool:
    """Extend the lease of the running job ``worker_id`` holds; False when it holds it no more."""
    now = utcnow()
    renewed = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.worker_id == worker_id, Job.status == JobStatus.running.value)
        .values(lease_expires_at=now + dt.timedelta(seconds=lease_s))
    )
    return _rowcount(renewed) == 1


@dataclass(frozen=True)
class ProgressAck:
    """What a progress write learned: whether the worker still holds the job, and the cancel flag."""

    held: bool
    cancel_requested: bool


def report_progress(
    session: Session,
    *,
    job_id: str,
    worker_id: str,
    stage: str | None,
    progress: float,
    messages: Sequence[str] = (),
) -> ProgressAck:
    """Write stage, progress and log ``messages`` of a running job held by ``worker_id``; read its cancel flag.

    A worker that no longer holds the job writes nothing, log lines included.
    """
    values: dict[str, Any] = {"progress": min(1.0, max(0.0, progress)), "updated_at": utcnow()}
    if stage is not None:
        values["stage"] = stage
    written = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.worker_id == worker_id, Job.status == JobStatus.running.value)
        .values(**values)
    )
    held = _rowcount(written) == 1
    if held and messages:
        append_logs(session, job_id=job_id, messages=messages)
    return ProgressAck(held=held, cancel_requested=cancel_requested(session, job_id=job_id))


def job_control(session: Session, *, job_id: str, worker_id: str) -> ProgressAck:
    """Read, without writing, whether ``worker_id`` still holds the running job and its cancel flag."""
    row = session.execute(
        select(Job.status, Job.worker_id, Job.cancel_requested).where(Job.id == job_id)
    ).one_or_none()
    if row is None:
        return ProgressAck(held=False, cancel_requested=True)
    held = row.status == JobStatus.running.value and row.worker_id == worker_id
    return ProgressAck(held=held, cancel_requested=bool(row.cancel_requested))


def cancel_requested(session: Session, *, job_id: str) -> bool:
    return bool(session.scalar(select(Job.cancel_requested).where(Job.id == job_id)))


@dataclass(frozen=True)
class ArtifactRecord:
    name: str
    size: int
    sha256: str
    media_type: str
    storage_key: str


def finish_job(
    session: Session,
    *,
    job_id: str,
    worker_id: str,
    status: JobStatus,
    error_code: str | None = None,
    error_message: str | None = None,
    result: dict[str, Any] | None = None,
    artifacts: Sequence[ArtifactRecord] = (),
    messages: Sequence[str] = (),
) -> bool:
    """Record the end of a running job held by ``worker_id``, with its artifacts and last log lines.

    Returns False (and writes nothing) when the job is no longer running under this worker.
    """
    if not status.finished:
        raise ValueError(f"finish_job needs a final status, got {status}")
    now = utcnow()
    values: dict[str, Any] = {"status": status.value, "finished_at": now, "updated_at": now,
                              "error_code": error_code, "error_message": error_message, "result": result,
                              "lease_expires_at": None}
    if status is JobStatus.succeeded:
        values.update(progress=1.0)
    done = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.worker_id == worker_id, Job.status == JobStatus.running.value)
        .values(**values)
    )
    if _rowcount(done) != 1:
        return False
    if messages:
        append_logs(session, job_id=job_id, messages=messages)
    session.add_all(
        Artifact(job_id=job_id, name=a.name, size=a.size, sha256=a.sha256, media_type=a.media_type,
                 storage_key=a.storage_key)
        for a in artifacts
    )
    session.flush()
    return True


# --- the sweeper: lost workers and lost messages -----------------------------------------------------


@dataclass(frozen=True)
class LostJob:
    """A running job whose lease has expired, as it was when the sweeper found it."""

    id: str
    worker_id: str | None
    attempts: int
    cancel_requested: bool


def jobs_with_expired_leases(session: Session, *, limit: int = 100) -> list[LostJob]:
    query = (
        select(Job.id, Job.worker_id, Job.attempts, Job.cancel_requested)
        .where(Job.status == JobStatus.running.value, _lease_expired(utcnow()))
        .order_by(Job.lease_expires_at)
        .limit(limit)
    )
    return [LostJob(id=r.id, worker_id=r.worker_id, attempts=r.attempts, cancel_requested=bool(r.cancel_requested))
            for r in session.execute(query)]


def release_lost_job(session: Session, *, job: LostJob, max_attempts: int) -> JobStatus | None:
    """End the attempt of a worker that stopped renewing its lease; returns the job's new status.

    ``cancelled`` when a cancel was asked for, ``failed`` with ``worker_lost`` when no attempt is
    left, else ``queued`` again (the caller sends it to the broker). None when the job changed in
    the meantime (its worker renewed the lease, or another sweeper got there first).
    """
    now = utcnow()
    holder = job.worker_id or "an unknown worker"
    values: dict[str, Any] = {"updated_at": now, "lease_expires_at": None, "worker_id": None}
    if job.cancel_requested:
        status = JobStatus.cancelled
        message = f"cancelled on request; its worker {holder} stopped answering before it could stop the job"
        values.update(status=status.value, finished_at=now, error_code="cancelled", error_message=message)
    elif job.attempts >= max_attempts:
        status = JobStatus.failed
        message = (f"the worker running attempt {job.attempts} ({holder}) stopped renewing its lease (it crashed, "
                   f"was killed or lost the database), and the job has had all {max_attempts} attempts "
                   "(CAHP_MAX_ATTEMPTS); check the worker's log, e.g. for running out of memory, and submit it again")
        values.update(status=status.value, finished_at=now, error_code="worker_lost", error_message=message)
    else:
        status = JobStatus.queued
        message = f"worker {holder} stopped renewing its lease during attempt {job.attempts}; queued again"
        values.update(status=status.value, stage=None, progress=0.0, enqueued_at=None)
    released = session.execute(
        update(Job)
        .where(Job.id == job.id, Job.status == JobStatus.running.value, Job.attempts == job.attempts,
               Job.worker_id == job.worker_id if job.worker_id is not None else Job.worker_id.is_(None),
               _lease_expired(now))
        .values(**values)
    )
    if _rowcount(released) != 1:
        return None
    append_logs(session, job_id=job.id, messages=[message])
    return status


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
    return _rowcount(session.execute(query.values(enqueued_at=utcnow()))) == 1


def mark_not_enqueued(session: Session, *, job_id: str) -> None:
    """The send failed: leave the job for the next sweep to send."""
    session.execute(update(Job).where(Job.id == job_id, Job.status == JobStatus.queued.value)
                    .values(enqueued_at=None))


# --- logs -------------------------------------------------------------------------------------------


def next_log_line(session: Session, *, job_id: str) -> int:
    last = session.scalar(select(func.max(JobLog.line)).where(JobLog.job_id == job_id))
    return 0 if last is None else last + 1


def append_logs(session: Session, *, job_id: str, messages: Sequence[str]) -> int:
    """Append ``messages`` after the job's last line; returns the next free line number.

    Line numbers are taken inside the transaction, so two writers must not append to one job at
    once: callers first update the job row (a conditional ``UPDATE``), which serialises them on its
    row lock (PostgreSQL) or the database write lock (SQLite).
    """
    first_line = next_log_line(session, job_id=job_id)
    session.add_all(
        JobLog(job_id=job_id, line=first_line + i, message=message) for i, message in enumerate(messages)
    )
    session.flush()
    return first_line + len(messages)


def read_logs(session: Session, *, job_id: str, offset: int, limit: int) -> list[JobLog]:
    query = (
        select(JobLog).where(JobLog.job_id == job_id, JobLog.line >= offset).order_by(JobLog.line).limit(limit)
    )
    return list(session.scalars(query))


# --- artifacts --------------------------------------------------------------------------------------


def list_artifacts(session: Session, *, job_id: str) -> list[Artifact]:
    return list(session.scalars(select(Artifact).where(Artifact.job_id == job_id).order_by(Artifact.name)))


def get_artifact(session: Session, *, job_id: str, name: str) -> Artifact | None:
    return session.scalar(select(Artifact).where(Artifact.job_id == job_id, Artifact.name == name))


def _rowcount(result: Any) -> int:
    return int(getattr(result, "rowcount", 0))
