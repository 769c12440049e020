"""API keys: add, read, list, revoke, note a use, and the ``--no-auth`` principal."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import String, bindparam, func, or_, select, update
from sqlalchemy.orm import Session

from app.core.db._database import utcnow
from app.core.db._models import ApiKey
from app.core.db.repository._rows import rowcount
from app.core.security import LOCAL_PRINCIPAL_ID, hash_key


def add_api_key(session: Session, *, key_id: str, name: str, key_hash: str) -> ApiKey:
    row = ApiKey(id=key_id, name=name, key_hash=key_hash)
    session.add(row)
    session.flush()
    return row


def get_api_key(session: Session, *, key_id: str) -> ApiKey | None:
    return session.get(ApiKey, key_id)


#: Built once: the stored hash of one key, or the default the caller passes.
_KEY_HASH = select(func.coalesce(select(ApiKey.key_hash).where(ApiKey.id == bindparam("key_id")).scalar_subquery(),
                                 bindparam("default", type_=String())))


def api_key_hash(session: Session, *, key_id: str, default: str) -> str:
    """The stored hash of the key ``key_id``, or ``default`` when there is no such key.

    One row of one column either way (the database picks the default), read on the connection with
    no ORM object built, so a missing id costs what a found one does (see
    :func:`app.core.security._keys.authenticate`).
    """
    return str(session.connection().execute(_KEY_HASH, {"key_id": key_id, "default": default}).scalar_one())


def list_api_keys(session: Session) -> list[ApiKey]:
    """Every key but the ``--no-auth`` principal, oldest first."""
    query = select(ApiKey).where(ApiKey.id != LOCAL_PRINCIPAL_ID).order_by(ApiKey.created_at, ApiKey.id)
    return list(session.scalars(query))


def revoke_api_key(session: Session, *, key_id: str) -> bool:
    """Mark the key revoked; False when it was already revoked (the first revocation time stays)."""
    result = session.execute(
        update(ApiKey).where(ApiKey.id == key_id, ApiKey.revoked_at.is_(None)).values(revoked_at=utcnow())
    )
    return rowcount(result) == 1


def touch_api_key(session: Session, *, key_id: str, now: dt.datetime, every_s: float) -> None:
    """Record a use of the key, unless one was recorded less than ``every_s`` ago.

    Conditional, so concurrent requests write at most one row version per interval.
    """
    stale = now - dt.timedelta(seconds=every_s)
    session.execute(
        update(ApiKey)
        .where(ApiKey.id == key_id, or_(ApiKey.last_used_at.is_(None), ApiKey.last_used_at < stale))
        .values(last_used_at=now)
    )


def ensure_local_principal(session: Session) -> ApiKey:
    """The owner used by ``--no-auth`` servers; its stored hash matches no key anyone holds."""
    row = session.get(ApiKey, LOCAL_PRINCIPAL_ID)
    if row is None:
        row = add_api_key(session, key_id=LOCAL_PRINCIPAL_ID, name="local (no-auth)",
                          key_hash=hash_key(f"no key is {LOCAL_PRINCIPAL_ID}"))
    return row
