"""Which queued job the pool starts next: keys served in turn, not messages in arrival order.

The broker hands messages out first in, first out, so one key's backlog (or an accuracy budget's
pieces) would stand before every later job of every other key. A message is therefore only a
prompt to start *some* work: the worker that takes one starts the job of the key that is owed a turn
(:func:`fair_pick`), which may be another job than the message names. Every queued job has a message
of its own, so every job is started by some message; a message whose job was started by another (or
was cancelled: it leaves the queue at once) starts the next job owed a turn, or nothing.

A key's standing is ``(running, last_start)``: how many of its jobs and budget pieces run now, then
when it last had a job started (never counts as longest ago). The key with the smallest standing is
owed the next start; ties keep the message's own job, so one key's jobs still start in the order the
broker gives them. With one slot, a job of a key with nothing running starts after at most one job of
a key with a backlog.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.core.db._models import BudgetPiece, Job, JobStatus

#: A key with no job ever started stands before every key that had one.
_NEVER = dt.datetime.min.replace(tzinfo=dt.UTC)


@dataclass(frozen=True, order=True)
class Standing:
    """A key's place in the turn: fewer running first, then the one whose last start is oldest."""

    running: int
    last_start: dt.datetime


@dataclass(frozen=True)
class Pick:
    """The queued job owed the next start, its key, and that key's standing."""

    job_id: str
    owner_id: str
    standing: Standing


def standings(session: Session, owner_ids: Iterable[str]) -> dict[str, Standing]:
    """Each key's :class:`Standing`: its running jobs and pieces, and its latest job start."""
    owners = sorted(set(owner_ids))
    if not owners:
        return {}
    running = dict(session.execute(
        select(Job.owner_id, func.count()).where(Job.owner_id.in_(owners), Job.status == JobStatus.running.value)
        .group_by(Job.owner_id)).tuples().all())
    pieces = dict(session.execute(
        select(Job.owner_id, func.count()).join(BudgetPiece, BudgetPiece.job_id == Job.id)
        .where(Job.owner_id.in_(owners), BudgetPiece.status == "running").group_by(Job.owner_id)).tuples().all())
    started = dict(session.execute(
        select(Job.owner_id, func.max(Job.started_at)).where(Job.owner_id.in_(owners))
        .group_by(Job.owner_id)).tuples().all())
    return {o: Standing(running.get(o, 0) + pieces.get(o, 0), _aware(started.get(o)) or _NEVER) for o in owners}


def fair_pick(session: Session, *, max_attempts: int, exclude_owner: str | None = None) -> Pick | None:
    """The queued job the pool should start next (of the key owed a turn, its oldest), or None."""
    takeable = (Job.status == JobStatus.queued.value, Job.attempts < max_attempts, Job.cancel_requested.is_(False))
    query = select(Job.owner_id).where(*takeable).group_by(Job.owner_id)
    if exclude_owner is not None:
        query = query.where(Job.owner_id != exclude_owner)
    owners = list(session.scalars(query))
    if not owners:
        return None
    standing = standings(session, owners)
    owner = min(owners, key=lambda o: (standing[o], o))
    job_id = session.scalar(select(Job.id).where(Job.owner_id == owner, *takeable)
                            .order_by(Job.created_at, Job.id).limit(1))
    return Pick(job_id=job_id, owner_id=owner, standing=standing[owner]) if job_id is not None else None


def job_owed_before_piece(session: Session, *, piece_id: str, max_attempts: int) -> str | None:
    """A queued job of another key that stands before the piece's key, to start instead of the piece.

    A piece left unclaimed is run by its search's own worker, so a budget's pieces wait; another key's
    job would otherwise wait behind all of them.
    """
    owner = session.scalar(select(Job.owner_id).join(BudgetPiece, BudgetPiece.job_id == Job.id)
                           .where(BudgetPiece.id == piece_id, BudgetPiece.status == "queued"))
    if owner is None:
        return None
    pick = fair_pick(session, max_attempts=max_attempts, exclude_owner=owner)
    if pick is None or not pick.standing < standings(session, [owner])[owner]:
        return None
    return pick.job_id


def _aware(value: dt.datetime | None) -> dt.datetime | None:
    # SQLite hands datetimes back naive (they are stored in UTC).
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    return value
