"""Uploads: recorded first, visible once complete, removed when abandoned."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from app.core.db._database import utcnow
from app.core.db._models import Upload


def add_upload(session: Session, upload: Upload) -> Upload:
    """Record an upload; it stays invisible until :func:`complete_upload` (its object is not stored yet)."""
    session.add(upload)
    session.flush()
    return upload


def complete_upload(session: Session, *, upload_id: str) -> None:
    session.execute(update(Upload).where(Upload.id == upload_id).values(completed_at=utcnow()))


def get_upload(session: Session, *, upload_id: str, owner_id: str) -> Upload | None:
    """A complete upload of ``owner_id``, or None."""
    return session.scalar(select(Upload).where(Upload.id == upload_id, Upload.owner_id == owner_id,
                                               Upload.completed_at.is_not(None)))


def stale_uploads(session: Session, *, started_before: dt.datetime, limit: int = 100) -> list[Upload]:
    """Uploads recorded before ``started_before`` and never completed: their API process died."""
    query = select(Upload).where(Upload.completed_at.is_(None), Upload.created_at < started_before)
    return list(session.scalars(query.order_by(Upload.created_at).limit(limit)))


def delete_upload(session: Session, *, upload_id: str) -> None:
    session.execute(delete(Upload).where(Upload.id == upload_id))


def find_upload_by_digest(session: Session, *, owner_id: str, sha256: str, suffix: str | None = None) -> Upload | None:
    """``owner_id``'s newest complete upload of the bytes with this ``sha256`` (and ``suffix``), or None.

    Only the key's own uploads: another key's identical bytes are never found, so a digest tells a
    caller nothing about what others uploaded.
    """
    query = select(Upload).where(Upload.owner_id == owner_id, Upload.sha256 == sha256, Upload.completed_at.is_not(None))
    if suffix is not None:
        query = query.where(Upload.suffix == suffix)
    return session.scalar(query.order_by(Upload.created_at.desc(), Upload.id.desc()).limit(1))
