"""Job log lines, numbered from 0 within each job."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.core.db._models import JobLog


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
