"""A job's attempts: one row per claim, opened by the claim and closed by whatever ended it.

Every write here runs in the transaction of the job's own state change (the claim, the end, the hand-back,
the sweeper's release), after that change's conditional ``UPDATE`` succeeded: only the writer that won
the job's row writes its attempt, so the history cannot disagree with the job.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import Connection, Row, bindparam, func, select, update
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import Session

from app.core.db._database import utcnow
from app.core.db._models import AttemptEnd, JobAttempt


def open_attempt(session: Session, *, job_id: str, worker_id: str, now: dt.datetime | None = None) -> int:
    """Record that ``worker_id`` starts an attempt at the job now; returns its number (1, 2, ...).

    An attempt still open is closed as ``lost`` first: its worker let the lease expire and this
    claim took the job over before the sweeper noticed. ``now``: the claim's own time, so that the first
    attempt starts when the job does.
    """
    now = now or utcnow()
    close_attempt(session, job_id=job_id, worker_id=None, reason=AttemptEnd.lost)
    number = (session.scalar(select(func.max(JobAttempt.number)).where(JobAttempt.job_id == job_id)) or 0) + 1
    session.add(JobAttempt(job_id=job_id, number=number, worker_id=worker_id, started_at=now))
    session.flush()
    return number


def close_attempt(session: Session, *, job_id: str, worker_id: str | None, reason: AttemptEnd) -> None:
    """End the job's open attempt (``worker_id``'s, when given) with ``reason``."""
    query = update(JobAttempt).where(JobAttempt.job_id == job_id, JobAttempt.ended_at.is_(None))
    if worker_id is not None:
        query = query.where(JobAttempt.worker_id == worker_id)
    session.execute(query.values(ended_at=utcnow(), end_reason=reason.value))


def note_resumed_from(session: Session, *, job_id: str, worker_id: str, resumed_from: str) -> None:
    """Record the saved step the open attempt of ``worker_id`` goes on from."""
    session.execute(update(JobAttempt)
                    .where(JobAttempt.job_id == job_id, JobAttempt.worker_id == worker_id,
                           JobAttempt.ended_at.is_(None))
                    .values(resumed_from=resumed_from[:255]))


_ATTEMPTS = JobAttempt.__table__
#: Built once, as the status poll's read of the job row (:func:`~.jobs.job_row`).
_ATTEMPT_ROWS = (select(_ATTEMPTS.c.number, _ATTEMPTS.c.worker_id, _ATTEMPTS.c.started_at, _ATTEMPTS.c.ended_at,
                        _ATTEMPTS.c.end_reason, _ATTEMPTS.c.resumed_from)
                 .where(_ATTEMPTS.c.job_id == bindparam("job_id")).order_by(_ATTEMPTS.c.number))


def attempt_rows(connection: Connection | Session, *, job_id: str) -> list[Row[Any]]:
    """The job's attempts as plain rows, oldest first (the status poll's second read)."""
    return list(connection.execute(_ATTEMPT_ROWS, {"job_id": job_id}))


def attempt_rows_sql(dialect: Dialect) -> str:
    """:func:`attempt_rows`'s statement as SQL text for ``dialect``, with a ``job_id`` parameter."""
    return str(_ATTEMPT_ROWS.compile(dialect=dialect))
