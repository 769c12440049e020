"""Liveness and readiness checks."""

from __future__ import annotations

from typing import Protocol

from sqlalchemy import text
from sqlalchemy.orm import Session

from app.api.background import JobQueue
from app.core.errors import UnavailableError


class LocalWorkers(Protocol):
    """The workers a ``cahp serve`` runs itself (embedded mode): how many should run, how many do."""

    @property
    def expected(self) -> int: ...

    def alive(self) -> int: ...


def check_ready(*, session: Session, queue: JobQueue, local_workers: LocalWorkers | None = None) -> None:
    """Raise UnavailableError unless the database and the broker answer and, where this server runs its
    own workers, at least one of them is alive (no job could move otherwise)."""
    if local_workers is not None and local_workers.expected > 0 and local_workers.alive() == 0:
        raise UnavailableError(f"none of this server's {local_workers.expected} worker(s) is running; a new one "
                               "is being started (see the server's log)")
    try:
        session.execute(text("SELECT 1"))
    except Exception as exc:
        raise UnavailableError(f"the database cannot be reached: {exc}") from exc
    queue.ping()
