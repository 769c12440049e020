"""A stopping worker's job: handed back to the queue with its resume state, or ended with it removed.

A worker that is shutting down (:mod:`worker.shutdown`) does not finish its job: the job goes back to
``queued`` with its attempt returned (:func:`app.core.db.repository.hand_back_job`), keeps the resume state
the engine saved (:mod:`worker.resume_store`), and the caller sends its message again at once, so any
worker resumes it. A job that ends (succeeded, failed, cancelled) has its resume state removed.
"""

from __future__ import annotations

import logging
from datetime import datetime

from app.core.db import JobStatus, repository, transaction
from app.core.metrics import observe_job_end
from app.core.storage import ArtifactStore, resume_prefix
from worker.reporting import JobReporter

logger = logging.getLogger(__name__)


def hand_back(reporter: JobReporter, *, attempt: int) -> bool:
    """Put the job ``reporter`` reports for back in the queue (False: it was cancelled or taken meanwhile)."""
    reporter.end_stage()
    lines = reporter.drain()
    message = (f"worker {reporter.worker_id} is shutting down: attempt {attempt} is handed back to the queue; "
               "the next attempt, on any worker, resumes from the checkpoints saved so far")
    with transaction(reporter.sessions) as session:
        handed = repository.hand_back_job(session, job_id=reporter.job_id, worker_id=reporter.worker_id,
                                          messages=[*lines, message])
    if handed:
        logger.warning("job %s: %s", reporter.job_id, message)
    return handed


def job_ended(store: ArtifactStore, *, job_id: str, status: JobStatus, created_at: datetime | None) -> None:
    """A job's end, recorded: its resume state removed, ``cahp_job_duration_seconds`` observed."""
    observe_job_end(status.value, created_at)
    try:
        store.delete_prefix(resume_prefix(job_id))
    except Exception as exc:  # the job's deletion (or retention) removes them with its artifacts
        logger.warning("could not delete the checkpoints of job %s: %s", job_id, exc)
