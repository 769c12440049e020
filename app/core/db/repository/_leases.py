"""A running job and the worker holding it: claim, renew, progress, end, and take-over when lost."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, case, func, or_, select, update
from sqlalchemy.orm import Session

from app.core.db._database import utcnow
from app.core.db._models import Artifact, AttemptEnd, Job, JobStatus
from app.core.db.repository._artifacts import ArtifactRecord
from app.core.db.repository._attempts import close_attempt, open_attempt
from app.core.db.repository._events import FINAL_EVENT, STAGE_CHANGED, record_event
from app.core.db.repository._fairness import fair_pick, standings
from app.core.db.repository._jobs import get_job
from app.core.db.repository._logs import append_logs
from app.core.db.repository._rows import rowcount
from app.core.settings import DEFAULT_LEASE_S, DEFAULT_MAX_ATTEMPTS


def _lease_expired(now: dt.datetime) -> Any:
    # A running row without a lease comes from before leases existed; it counts as expired.
    return or_(Job.lease_expires_at.is_(None), Job.lease_expires_at < now)


def _held(job_id: str, worker_id: str) -> tuple[Any, ...]:
    """The row of the job ``job_id`` while ``worker_id`` runs it: a worker's every write is conditional on it."""
    return (Job.id == job_id, Job.worker_id == worker_id, Job.status == JobStatus.running.value)


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
                lease_expires_at=now + dt.timedelta(seconds=lease_s), updated_at=now, stage=None, eta_s=None,
                # The first attempt's start, kept by the next ones, and the progress already shown: a
                # client's elapsed time and progress bar never jump back when a worker is replaced.
                started_at=func.coalesce(Job.started_at, now))
    )
    if rowcount(claimed) != 1:
        return None
    open_attempt(session, job_id=job_id, worker_id=worker_id, now=now)
    return get_job(session, job_id=job_id)


def claim_next_job(
    session: Session,
    *,
    job_id: str,
    worker_id: str,
    lease_s: float = DEFAULT_LEASE_S,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
) -> Job | None:
    """Start the job the pool owes a turn, prompted by the message for ``job_id`` (:mod:`.fairness`).

    The message's own job when it can be claimed and its key stands no worse than the key owed a turn;
    else the job of that key (a message whose job ended, was cancelled or started elsewhere starts
    another). Each claim is :func:`claim_job`'s conditional ``UPDATE``, so a pick another worker took
    meanwhile is passed over for the next.
    """
    own = session.scalar(select(Job.owner_id).where(Job.id == job_id, Job.status == JobStatus.queued.value,
                                                    Job.attempts < max_attempts))
    for _ in range(5):
        pick = fair_pick(session, max_attempts=max_attempts, exclude_owner=own)
        if own is not None and (pick is None or standings(session, [own])[own] <= pick.standing):
            break
        if pick is None:
            break
        claimed = claim_job(session, job_id=pick.job_id, worker_id=worker_id, lease_s=lease_s,
                            max_attempts=max_attempts)
        if claimed is not None:
            return claimed
    return claim_job(session, job_id=job_id, worker_id=worker_id, lease_s=lease_s, max_attempts=max_attempts)


def renew_lease(session: Session, *, job_id: str, worker_id: str, lease_s: float) -> bool:
    """Extend the lease of the running job ``worker_id`` holds; False when it holds it no more."""
    now = utcnow()
    renewed = session.execute(
        update(Job)
        .where(*_held(job_id, worker_id))
        .values(lease_expires_at=now + dt.timedelta(seconds=lease_s))
    )
    return rowcount(renewed) == 1


#: Why an attempt ended, by the job's final status.
_ENDS = {JobStatus.succeeded: AttemptEnd.completed, JobStatus.failed: AttemptEnd.failed,
         JobStatus.cancelled: AttemptEnd.cancelled}


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
    eta_s: float | None = None,
) -> ProgressAck:
    """Write stage, progress, ``eta_s`` and log ``messages`` of a job ``worker_id`` holds; read its cancel flag.

    A worker that no longer holds the job writes nothing, log lines included.
    """
    shown = min(1.0, max(0.0, progress))
    # Never below what a client was shown (an attempt that resumes re-counts its stages from their start).
    values: dict[str, Any] = {"progress": case((Job.progress > shown, Job.progress), else_=shown),
                              "updated_at": utcnow(), "eta_s": eta_s}
    held_by = _held(job_id, worker_id)
    held = False
    if stage is not None:
        # A stage change is its own conditional UPDATE, so that it is known (and reported to
        # webhooks) exactly once, by the write that made it.
        changed = session.execute(
            update(Job).where(*held_by, or_(Job.stage.is_(None), Job.stage != stage)).values(**values, stage=stage)
        )
        held = rowcount(changed) == 1
        if held:
            record_event(session, job_id=job_id, event_type=STAGE_CHANGED)
    if not held:
        held = rowcount(session.execute(update(Job).where(*held_by).values(**values))) == 1
    if held and messages:
        append_logs(session, job_id=job_id, messages=messages)
    return ProgressAck(held=held, cancel_requested=cancel_requested(session, job_id=job_id))


def report_target(session: Session, *, job_id: str, worker_id: str, target: Mapping[str, Any]) -> bool:
    """Write the target record of a run that pruned to a speed or FLOPs target, on a job ``worker_id`` holds.

    Whether it still holds the job: a worker that lost it writes nothing. A later attempt's record
    replaces an earlier one's (it pruned again, perhaps on another machine).
    """
    written = session.execute(
        update(Job).where(*_held(job_id, worker_id)).values(target=dict(target), updated_at=utcnow())
    )
    return rowcount(written) == 1


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
    registration: Mapping[str, Any] | None = None,
    event_details: Mapping[str, Any] | None = None,
) -> bool:
    """Record the end of a running job held by ``worker_id``, with its artifacts and last log lines.

    ``registration`` is how its MLflow registration went (when it asked for one); ``event_details`` go
    into the event's payload as they are (:func:`~.events.record_event`: the artifacts' signed links,
    the run's identity and recipe).
    Returns False (and writes nothing) when the job is no longer running under this worker.
    """
    if not status.finished:
        raise ValueError(f"finish_job needs a final status, got {status}")
    now = utcnow()
    values: dict[str, Any] = {"status": status.value, "finished_at": now, "updated_at": now,
                              "error_code": error_code, "error_message": error_message, "result": result,
                              "lease_expires_at": None, "eta_s": None}
    if status is JobStatus.succeeded:
        values.update(progress=1.0)
    if registration is not None:
        values["registration"] = dict(registration)
        values["registration_history"] = [dict(registration)]  # the job's own, the first of its list
    done = session.execute(
        update(Job)
        .where(*_held(job_id, worker_id))
        .values(**values)
    )
    if rowcount(done) != 1:
        return False
    close_attempt(session, job_id=job_id, worker_id=worker_id, reason=_ENDS[status])
    if messages:
        append_logs(session, job_id=job_id, messages=messages)
    record_event(session, job_id=job_id, event_type=FINAL_EVENT[status], details=event_details)
    session.add_all(
        Artifact(job_id=job_id, name=a.name, size=a.size, sha256=a.sha256, media_type=a.media_type,
                 storage_key=a.storage_key)
        for a in artifacts
    )
    session.flush()
    return True


def hand_back_job(session: Session, *, job_id: str, worker_id: str, messages: Sequence[str]) -> bool:
    """Put the running job ``worker_id`` holds back in the queue now, for another worker to resume.

    For a worker that is shutting down (SIGTERM: a redeploy, a preempted machine): its attempt is
    given back rather than used up, so ``attempts`` goes down by one and redeploys never fail a job
    as ``worker_lost``. ``enqueued_at`` is set: the caller sends the message itself (the sweeper
    sends it again after ``CAHP_REQUEUE_AFTER_S`` if that fails). A job asked to cancel is not handed
    back (the worker ends it ``cancelled``). ``messages`` go to the job's log. Returns False, writing
    nothing, when the job is no longer running under ``worker_id``.
    """
    now = utcnow()
    handed = session.execute(
        update(Job)
        .where(*_held(job_id, worker_id), Job.cancel_requested.is_(False))
        .values(status=JobStatus.queued.value, worker_id=None, lease_expires_at=None, attempts=Job.attempts - 1,
                stage=None, eta_s=None, enqueued_at=now, updated_at=now)
    )
    if rowcount(handed) != 1:
        return False
    close_attempt(session, job_id=job_id, worker_id=worker_id, reason=AttemptEnd.handed_back)
    append_logs(session, job_id=job_id, messages=messages)
    return True


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
    values: dict[str, Any] = {"updated_at": now, "lease_expires_at": None, "worker_id": None, "eta_s": None}
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
        values.update(status=status.value, stage=None, enqueued_at=None)
    released = session.execute(
        update(Job)
        .where(Job.id == job.id, Job.status == JobStatus.running.value, Job.attempts == job.attempts,
               Job.worker_id == job.worker_id if job.worker_id is not None else Job.worker_id.is_(None),
               _lease_expired(now))
        .values(**values)
    )
    if rowcount(released) != 1:
        return None
    close_attempt(session, job_id=job.id, worker_id=job.worker_id, reason=AttemptEnd.lost)
    append_logs(session, job_id=job.id, messages=[message])
    if status.finished:
        record_event(session, job_id=job.id, event_type=FINAL_EVENT[status])
    return status
