"""The sweeper: the API's background duty that keeps every job moving after crashes and restarts.

Each sweep, at start-up and then every ``CAHP_SWEEP_INTERVAL_S``:

1. **Lost workers.** A running job whose lease has expired (its worker died, hung, or lost the
   database for longer than the lease) goes back to ``queued`` for another attempt, or ends
   ``failed`` with ``worker_lost`` after ``CAHP_MAX_ATTEMPTS`` attempts, or ``cancelled`` if a
   cancel was pending. So no job stays ``running`` longer than lease + sweep interval after its
   worker is gone (:attr:`app.core.settings.Settings.takeover_bound_s`).
2. **Lost messages.** A queued job that was never sent (the broker was down at submit, or the job
   was just re-queued), or whose message is no longer waiting in the broker (Redis restarted
   without persistence, a queue was purged) is sent again (:mod:`app.api.background._broker_probe`).
3. **Abandoned uploads.** An upload whose API process died before it was complete is removed,
   object and row, and partial files in the spool directory are deleted.
4. **Retention.** With ``CAHP_ARTIFACT_TTL_DAYS`` set, the stored artifacts of jobs that finished
   longer ago are deleted and the job is marked ``artifacts_expired`` (its artifact routes answer
   410). Objects first, then the mark: a sweep that dies between the two is finished by the next.
   Only finished jobs are touched; a running job has no ``finished_at``.

Every step is a conditional update, so several API replicas may sweep at once; at worst a job is
sent twice, and the second message is ignored by the worker.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from app.api.background._producer import JobQueue
from app.core.db import JobStatus, repository, transaction, utcnow
from app.core.errors import UnavailableError
from app.core.metrics import JOB_FAILURES, JOBS_FINISHED, LEASE_TAKEOVERS, observe_job_end
from app.core.periodic import Periodic, PeriodicDuty
from app.core.settings import Settings
from app.core.storage import ArtifactStore, job_prefix, resume_prefix

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SweepReport:
    """What one sweep did, by job id."""

    requeued: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    cancelled: tuple[str, ...] = ()
    sent: tuple[str, ...] = ()
    uploads_removed: tuple[str, ...] = ()
    spool_files_removed: int = 0
    artifacts_expired: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return any((self.requeued, self.failed, self.cancelled, self.sent, self.uploads_removed,
                    self.spool_files_removed, self.artifacts_expired))


def sweep_once(
    *, sessions: sessionmaker[Session], queue: JobQueue, store: ArtifactStore, settings: Settings
) -> SweepReport:
    """Run the four steps once; see the module docstring."""
    outcome: dict[JobStatus, list[str]] = {JobStatus.queued: [], JobStatus.failed: [], JobStatus.cancelled: []}
    with transaction(sessions) as session:
        lost = repository.jobs_with_expired_leases(session)
    for job in lost:
        with transaction(sessions) as session:
            status = repository.release_lost_job(session, job=job, max_attempts=settings.max_attempts)
        if status is not None:
            logger.warning("job %s: worker %s lost during attempt %d; job is now %s", job.id, job.worker_id,
                           job.attempts, status.value)
            outcome[status].append(job.id)
            LEASE_TAKEOVERS.labels({JobStatus.queued: "requeued"}.get(status, status.value)).inc()
            if status.finished:
                JOBS_FINISHED.labels(status.value).inc()
                with transaction(sessions) as session:
                    ended = repository.get_job(session, job_id=job.id)
                    observe_job_end(status.value, ended.created_at if ended is not None else None)
                _remove_resume_state(store, job.id)
            if status is JobStatus.failed:
                JOB_FAILURES.labels("worker_lost").inc()
    sent = _send_queued(sessions=sessions, queue=queue, settings=settings)
    uploads = _remove_stale_uploads(sessions=sessions, store=store, settings=settings)
    spool = _clean_spool(settings)
    expired = _expire_artifacts(sessions=sessions, store=store, settings=settings)
    return SweepReport(requeued=tuple(outcome[JobStatus.queued]), failed=tuple(outcome[JobStatus.failed]),
                       cancelled=tuple(outcome[JobStatus.cancelled]), sent=tuple(sent),
                       uploads_removed=tuple(uploads), spool_files_removed=spool, artifacts_expired=tuple(expired))


def _remove_resume_state(store: ArtifactStore, job_id: str) -> None:
    """The resume state of a job the sweeper ended (a requeued one keeps it for its next attempt)."""
    # When it fails, it goes with the job, or by the retention rule, later.
    _deleted(functools.partial(store.delete_prefix, resume_prefix(job_id)), f"the checkpoints of job {job_id}")


def _deleted(delete: Callable[[], object], what: str) -> bool:
    """Run ``delete`` on the store; when it fails, log that ``what`` was not deleted and answer False."""
    try:
        delete()
    except Exception as exc:
        logger.warning("sweeper: cannot delete %s: %s", what, exc)
        return False
    return True


def _expire_artifacts(*, sessions: sessionmaker[Session], store: ArtifactStore, settings: Settings) -> list[str]:
    if settings.artifact_ttl_days is None:
        return []
    cutoff = utcnow() - dt.timedelta(days=settings.artifact_ttl_days)
    with transaction(sessions) as session:
        old = repository.jobs_with_artifacts_to_expire(session, finished_before=cutoff)
    expired = _objects_then_rows(
        sessions,
        [(job_id, functools.partial(store.delete_prefix, job_prefix(job_id)), f"the artifacts of job {job_id}")
         for job_id in old],
        forget=lambda session, job_id: repository.expire_artifacts(session, job_id=job_id),
    )
    if expired:
        logger.info("sweeper: deleted the artifacts of %d job(s) past CAHP_ARTIFACT_TTL_DAYS", len(expired))
    return expired


def _send_queued(*, sessions: sessionmaker[Session], queue: JobQueue, settings: Settings) -> list[str]:
    cutoff = utcnow() - dt.timedelta(seconds=settings.requeue_after_s)
    with transaction(sessions) as session:
        candidates = repository.queued_jobs_to_send(session, sent_before=cutoff)
    if not candidates:
        return []
    try:
        waiting = queue.waiting_job_ids()
    except UnavailableError as exc:
        logger.warning("sweeper: %s; queued jobs are sent when it is back", exc)
        return []
    sent: list[str] = []
    for job_id, ever_sent in candidates:
        if waiting is not None and job_id in waiting:
            continue
        if waiting is None and ever_sent:
            continue  # a broker that cannot be listed: only never-sent jobs are known to need a message
        with transaction(sessions) as session:
            if not repository.mark_enqueued(session, job_id=job_id, sent_before=cutoff):
                continue  # claimed, cancelled or sent by another sweeper in the meantime
        try:
            queue.enqueue(job_id)
        except UnavailableError:
            with transaction(sessions) as session:
                repository.mark_not_enqueued(session, job_id=job_id)
            break  # the broker is down: the next sweep tries again
        sent.append(job_id)
    if sent:
        logger.info("sweeper: sent %d queued job(s) with no message in the broker", len(sent))
    return sent


def _remove_stale_uploads(*, sessions: sessionmaker[Session], store: ArtifactStore, settings: Settings) -> list[str]:
    cutoff = utcnow() - dt.timedelta(seconds=settings.upload_stale_s)
    with transaction(sessions) as session:
        stale = [(u.id, u.storage_key) for u in repository.stale_uploads(session, started_before=cutoff)]
    return _objects_then_rows(
        sessions,
        [(upload_id, functools.partial(store.delete, key), f"abandoned upload object {key}")
         for upload_id, key in stale],
        forget=_forget_upload,
    )


def _forget_upload(session: Session, upload_id: str) -> bool:
    """Delete an upload's row (it is gone whoever deleted it)."""
    repository.delete_upload(session, upload_id=upload_id)
    return True


def _objects_then_rows(
    sessions: sessionmaker[Session], doomed: Iterable[tuple[str, Callable[[], object], str]], *,
    forget: Callable[[Session, str], bool],
) -> list[str]:
    """For each ``(id, delete, what)``: ``delete`` the stored objects, then ``forget`` their row in a transaction
    of its own; the ids whose row ``forget`` changed.

    The objects first: one that cannot be deleted keeps its row, and a sweep that dies between the two leaves
    a row whose objects are gone, which the next sweep finishes.
    """
    done = []
    for key, delete, what in doomed:
        if not _deleted(delete, what):
            continue
        with transaction(sessions) as session:
            if forget(session, key):
                done.append(key)
    return done


def _clean_spool(settings: Settings) -> int:
    """Delete spool files not written to for ``upload_stale_s`` (left by an API that died)."""
    if not settings.spool_dir.is_dir():
        return 0
    cutoff = time.time() - settings.upload_stale_s
    removed = 0
    for path in settings.spool_dir.iterdir():
        try:
            if path.is_file() and path.stat().st_mtime < cutoff:
                path.unlink()
                removed += 1
        except FileNotFoundError:
            pass  # finished (and removed) by its upload meanwhile
    return removed


class Sweeper(PeriodicDuty):
    """Runs :func:`sweep_once` in a daemon thread: at once, then every ``settings.sweep_interval_s``."""

    def __init__(
        self, *, sessions: sessionmaker[Session], queue: JobQueue, store: ArtifactStore, settings: Settings
    ) -> None:
        self._sessions, self._queue, self._store, self._settings = sessions, queue, store, settings
        self._loop = Periodic(self._sweep, interval_s=settings.sweep_interval_s, name="cahp-sweeper",
                              immediately=True)

    def _sweep(self) -> None:
        report = sweep_once(sessions=self._sessions, queue=self._queue, store=self._store, settings=self._settings)
        if report:
            logger.info("sweeper: %s", report)
