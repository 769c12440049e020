"""Every read and write of the job database, as plain functions over a session.

The API's services and the worker both go through here, so each state change of a job is one
conditional ``UPDATE`` in one place: a transition happens only from the state it starts from
(``WHERE status = 'queued'``...), which is what makes two workers, or a worker and a cancel request,
safe to race. Functions never commit; the caller owns the transaction.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, delete, func, or_, select, update
from sqlalchemy.orm import Session

from app.db import utcnow
from app.models import ApiKey, Artifact, Job, JobLog, JobStatus, Upload
from app.security import LOCAL_PRINCIPAL_ID, hash_key

# --- API keys ---------------------------------------------------------------------------------------


def add_api_key(session: Session, *, key_id: str, name: str, key_hash: str) -> ApiKey:
    row = ApiKey(id=key_id, name=name, key_hash=key_hash)
    session.add(row)
    session.flush()
    return row


def get_api_key(session: Session, *, key_id: str) -> ApiKey | None:
    return session.get(ApiKey, key_id)


def ensure_local_principal(session: Session) -> ApiKey:
    """The owner used by ``--no-auth`` servers; its stored hash matches no key anyone holds."""
    row = session.get(ApiKey, LOCAL_PRINCIPAL_ID)
    if row is None:
        row = add_api_key(session, key_id=LOCAL_PRINCIPAL_ID, name="local (no-auth)",
                          key_hash=hash_key(f"no key is {LOCAL_PRINCIPAL_ID}"))
    return row


# --- uploads ----------------------------------------------------------------------------------------


def add_upload(session: Session, upload: Upload) -> Upload:
    session.add(upload)
    session.flush()
    return upload


def get_upload(session: Session, *, upload_id: str, owner_id: str) -> Upload | None:
    return session.scalar(select(Upload).where(Upload.id == upload_id, Upload.owner_id == owner_id))


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


def claim_job(session: Session, *, job_id: str, worker_id: str) -> Job | None:
    """Move a queued job to running for ``worker_id``; None when it is not queued (any more).

    Only one of several concurrent claims can succeed: the ``UPDATE`` is conditional on the status.
    """
    now = utcnow()
    claimed = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status == JobStatus.queued.value)
        .values(status=JobStatus.running.value, worker_id=worker_id, attempts=Job.attempts + 1,
                started_at=now, updated_at=now, stage=None, progress=0.0)
    )
    if _rowcount(claimed) != 1:
        return None
    return get_job(session, job_id=job_id)


@dataclass(frozen=True)
class ProgressAck:
    """What a progress write learned: whether the worker still holds the job, and the cancel flag."""

    held: bool
    cancel_requested: bool


def report_progress(
    session: Session, *, job_id: str, worker_id: str, stage: str | None, progress: float
) -> ProgressAck:
    """Write stage and progress of a running job held by ``worker_id`` and read its cancel flag."""
    values: dict[str, Any] = {"progress": min(1.0, max(0.0, progress)), "updated_at": utcnow()}
    if stage is not None:
        values["stage"] = stage
    written = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.worker_id == worker_id, Job.status == JobStatus.running.value)
        .values(**values)
    )
    return ProgressAck(held=_rowcount(written) == 1, cancel_requested=cancel_requested(session, job_id=job_id))


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
) -> bool:
    """Record the end of a running job held by ``worker_id``, with its artifacts, in one transaction.

    Returns False (and writes nothing) when the job is no longer running under this worker.
    """
    if not status.finished:
        raise ValueError(f"finish_job needs a final status, got {status}")
    now = utcnow()
    values: dict[str, Any] = {"status": status.value, "finished_at": now, "updated_at": now,
                              "error_code": error_code, "error_message": error_message, "result": result}
    if status is JobStatus.succeeded:
        values.update(progress=1.0)
    done = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.worker_id == worker_id, Job.status == JobStatus.running.value)
        .values(**values)
    )
    if _rowcount(done) != 1:
        return False
    session.add_all(
        Artifact(job_id=job_id, name=a.name, size=a.size, sha256=a.sha256, media_type=a.media_type,
                 storage_key=a.storage_key)
        for a in artifacts
    )
    session.flush()
    return True


# --- logs -------------------------------------------------------------------------------------------


def next_log_line(session: Session, *, job_id: str) -> int:
    last = session.scalar(select(func.max(JobLog.line)).where(JobLog.job_id == job_id))
    return 0 if last is None else last + 1


def append_logs(session: Session, *, job_id: str, first_line: int, messages: Sequence[str]) -> int:
    """Append ``messages`` as lines ``first_line``...; returns the next free line number."""
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
