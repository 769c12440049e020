"""Liveness and readiness checks."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.orm import Session

from app.api.background import JobQueue
from app.core.errors import UnavailableError


def check_ready(*, session: Session, queue: JobQueue) -> None:
    """Raise UnavailableError unless both the database and the broker answer."""
    try:
        session.execute(text("SELECT 1"))
    except Exception as exc:
        raise UnavailableError(f"the database cannot be reached: {exc}") from exc
    queue.ping()
