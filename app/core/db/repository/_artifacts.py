"""Artifact rows: what a finished job stored, and where."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from app.core.db._models import Artifact, Job, JobStatus
from app.core.db.repository._rows import rowcount

_FINISHED = [status.value for status in JobStatus if status.finished]


@dataclass(frozen=True)
class ArtifactRecord:
    name: str
    size: int
    sha256: str
    media_type: str
    storage_key: str


def list_artifacts(session: Session, *, job_id: str) -> list[Artifact]:
    return list(session.scalars(select(Artifact).where(Artifact.job_id == job_id).order_by(Artifact.name)))


def get_artifact(session: Session, *, job_id: str, name: str) -> Artifact | None:
    return session.scalar(select(Artifact).where(Artifact.job_id == job_id, Artifact.name == name))


def jobs_with_artifacts_to_expire(session: Session, *, finished_before: dt.datetime, limit: int = 100) -> list[str]:
    """Finished jobs that ended before ``finished_before`` and whose artifacts are still kept, oldest first."""
    query = (select(Job.id).where(Job.status.in_(_FINISHED), Job.finished_at < finished_before,
                                  Job.artifacts_expired.is_(False))
             .order_by(Job.finished_at).limit(limit))
    return list(session.scalars(query))


def expire_artifacts(session: Session, *, job_id: str) -> bool:
    """Mark a finished job's artifacts as removed and drop their rows (after the objects are deleted).

    Conditional on the job being finished and not yet marked: a running job is never touched.
    """
    marked = session.execute(update(Job).where(Job.id == job_id, Job.status.in_(_FINISHED),
                                               Job.artifacts_expired.is_(False)).values(artifacts_expired=True))
    if rowcount(marked) != 1:
        return False
    session.execute(delete(Artifact).where(Artifact.job_id == job_id))
    return True
