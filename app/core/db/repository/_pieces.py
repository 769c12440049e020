"""The pieces of an accuracy budget's search: added by the job's worker, claimed by any worker, leased.

The same rules as a job's (:mod:`.leases`): every transition is one conditional ``UPDATE`` from the
state it starts from, so a piece's message delivered twice, two workers, or the search taking back a
lost piece race safely. A piece can be claimed only while its job is running the attempt that asked for
it and is not being cancelled; only its holder may end it.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, exists, or_, select, update
from sqlalchemy.orm import Session

from app.core.db._database import utcnow
from app.core.db._models import BudgetPiece, Job, JobStatus
from app.core.db.repository._rows import rowcount


@dataclass(frozen=True)
class NewPiece:
    """A piece the search asks for: its candidate, its number, the engine's spec and the state to go on from."""

    candidate: str
    piece: int
    spec: dict[str, Any]
    resume_from: str | None


def add_pieces(session: Session, *, job_id: str, attempt: int, pieces: Sequence[NewPiece]) -> list[str]:
    """Record ``pieces`` as ``queued``; their ids, in order."""
    now = utcnow()
    ids = [uuid.uuid4().hex for _ in pieces]
    session.add_all(BudgetPiece(id=piece_id, job_id=job_id, attempt=attempt, candidate=p.candidate, piece=p.piece,
                                spec=p.spec, resume_from=p.resume_from, status="queued", attempts=0,
                                created_at=now, updated_at=now)
                    for piece_id, p in zip(ids, pieces, strict=True))
    session.flush()
    return ids


def _job_runs_its_attempt() -> Any:
    return exists().where(Job.id == BudgetPiece.job_id, Job.status == JobStatus.running.value,
                          Job.attempts == BudgetPiece.attempt, Job.cancel_requested.is_(False))


def claim_piece(session: Session, *, piece_id: str, worker_id: str, lease_s: float) -> BudgetPiece | None:
    """Hold the piece for ``worker_id`` for ``lease_s`` seconds; None when it cannot be taken.

    A piece can be taken when it is ``queued``, or ``running`` under an expired lease (its worker was
    lost), while its job runs the attempt that asked for it and is not being cancelled.
    """
    now = utcnow()
    takeable = or_(BudgetPiece.status == "queued",
                   and_(BudgetPiece.status == "running", BudgetPiece.lease_expires_at < now))
    claimed = session.execute(
        update(BudgetPiece)
        .where(BudgetPiece.id == piece_id, takeable, _job_runs_its_attempt())
        .values(status="running", worker_id=worker_id, attempts=BudgetPiece.attempts + 1,
                lease_expires_at=now + dt.timedelta(seconds=lease_s), updated_at=now)
        .execution_options(synchronize_session=False)
    )
    if rowcount(claimed) != 1:
        return None
    return session.scalar(select(BudgetPiece).where(BudgetPiece.id == piece_id)
                          .execution_options(populate_existing=True))


def renew_piece(session: Session, *, piece_id: str, worker_id: str, lease_s: float) -> bool:
    """Extend the lease of a running piece ``worker_id`` holds, while its job still wants it; False otherwise."""
    now = utcnow()
    renewed = session.execute(
        update(BudgetPiece)
        .where(BudgetPiece.id == piece_id, BudgetPiece.worker_id == worker_id, BudgetPiece.status == "running",
               _job_runs_its_attempt())
        .values(lease_expires_at=now + dt.timedelta(seconds=lease_s))
        .execution_options(synchronize_session=False)
    )
    return rowcount(renewed) == 1


def finish_piece(session: Session, *, piece_id: str, worker_id: str, result: dict[str, Any]) -> bool:
    """Record what the piece left; False when ``worker_id`` no longer holds it (its result is not kept)."""
    return _end_held(session, piece_id=piece_id, worker_id=worker_id, values={"status": "done", "result": result})


def release_piece(session: Session, *, piece_id: str, worker_id: str) -> bool:
    """Give a held piece back to the queue (its worker could not run it: another will)."""
    return _end_held(session, piece_id=piece_id, worker_id=worker_id, values={"status": "queued", "worker_id": None})


def _end_held(session: Session, *, piece_id: str, worker_id: str, values: dict[str, Any]) -> bool:
    """End ``worker_id``'s hold on a running piece with ``values``; False when it no longer holds it. Race-safe:
    the UPDATE matches only while the piece is running under this worker, so of two racing ends one wins."""
    ended = session.execute(
        update(BudgetPiece)
        .where(BudgetPiece.id == piece_id, BudgetPiece.worker_id == worker_id, BudgetPiece.status == "running")
        .values(**values, lease_expires_at=None, updated_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    return rowcount(ended) == 1


def requeue_lost_pieces(session: Session, *, piece_ids: Sequence[str]) -> list[str]:
    """Put the running pieces among ``piece_ids`` whose lease expired back in the queue; their ids."""
    now = utcnow()
    lost = list(session.scalars(select(BudgetPiece.id).where(
        BudgetPiece.id.in_(piece_ids), BudgetPiece.status == "running", BudgetPiece.lease_expires_at < now)))
    if lost:
        session.execute(
            update(BudgetPiece)
            .where(BudgetPiece.id.in_(lost), BudgetPiece.status == "running", BudgetPiece.lease_expires_at < now)
            .values(status="queued", worker_id=None, lease_expires_at=None, updated_at=now)
            .execution_options(synchronize_session=False)
        )
    return lost


def cancel_pieces(session: Session, *, job_id: str) -> int:
    """End every piece of the job not yet done (the job is cancelled or over); how many."""
    cancelled = session.execute(
        update(BudgetPiece)
        .where(BudgetPiece.job_id == job_id, BudgetPiece.status.in_(("queued", "running")))
        .values(status="cancelled", lease_expires_at=None, updated_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    return rowcount(cancelled)


def get_pieces(session: Session, *, piece_ids: Sequence[str]) -> list[BudgetPiece]:
    """The pieces ``piece_ids`` name, in that order (fresh from the database)."""
    rows = {row.id: row for row in session.scalars(select(BudgetPiece).where(BudgetPiece.id.in_(piece_ids))
                                                   .execution_options(populate_existing=True))}
    return [rows[piece_id] for piece_id in piece_ids if piece_id in rows]


def job_pieces(session: Session, *, job_id: str) -> list[BudgetPiece]:
    """Every piece of the job, of every attempt, oldest first."""
    return list(session.scalars(select(BudgetPiece).where(BudgetPiece.job_id == job_id)
                                .order_by(BudgetPiece.created_at, BudgetPiece.candidate, BudgetPiece.piece)))


def piece_wanted(session: Session, *, piece_id: str, worker_id: str) -> bool:
    """Whether ``worker_id`` still holds the piece and its job still runs the attempt that asked for it."""
    return bool(session.scalar(select(exists().where(
        BudgetPiece.id == piece_id, BudgetPiece.worker_id == worker_id, BudgetPiece.status == "running",
        _job_runs_its_attempt()))))
