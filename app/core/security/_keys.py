"""Creating, listing and revoking API keys, and finding the key a request presents."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.orm import Session

from app.core.db import ApiKey, repository, utcnow
from app.core.errors import AuthenticationError, InvalidRequestError, ResourceNotFoundError
from app.core.security._hashing import LOCAL_PRINCIPAL_ID, generate_key, hash_key, key_id_of, key_matches

#: Compared against when a presented key names no stored key.
_NO_KEY_HASH = hash_key("no key has this value")
#: ``last_used_at`` is written at most this often per key, so authenticating stays a read.
LAST_USED_EVERY_S = 60.0


@dataclass(frozen=True)
class KeyInfo:
    """What ``cahp keys list`` shows of a key: never the key or its hash."""

    id: str
    name: str
    created_at: dt.datetime
    last_used_at: dt.datetime | None
    revoked_at: dt.datetime | None
    #: At revocation: its queued jobs cancelled, and its running ones asked to stop.
    jobs_cancelled: int = 0
    jobs_stopping: int = 0


def list_keys(*, session: Session) -> list[KeyInfo]:
    return [KeyInfo(id=k.id, name=k.name, created_at=k.created_at, last_used_at=k.last_used_at,
                    revoked_at=k.revoked_at) for k in repository.list_api_keys(session)]


def revoke_key(*, session: Session, name_or_id: str) -> KeyInfo:
    """Revoke the key with this id, or the one live key with this name; it is refused at once.

    Its queued jobs are cancelled and its running ones asked to stop (between steps, as a cancel does):
    a key taken away must not go on spending the pool. Its signed links stop working too
    (:mod:`app.core.security._signing`).

    Raises
    ------
    ResourceNotFoundError
        When no key has this id or name.
    InvalidRequestError
        When several live keys share the name (their ids are listed: revoke one by id).
    """
    keys = repository.list_api_keys(session)
    chosen = [k for k in keys if k.id == name_or_id]
    if not chosen:
        named = [k for k in keys if k.name == name_or_id]
        live = [k for k in named if k.revoked_at is None]
        if len(live) > 1:
            ids = ", ".join(k.id for k in live)
            raise InvalidRequestError(
                f"{len(live)} live keys are named {name_or_id!r} (ids {ids}); revoke one by its id"
            )
        chosen = live or named
    if not chosen:
        raise ResourceNotFoundError(f"no API key has the id or name {name_or_id!r}; `cahp keys list` shows them")
    key = chosen[0]
    repository.revoke_api_key(session, key_id=key.id)
    cancelled, stopping = repository.cancel_key_jobs(session, owner_id=key.id)
    session.commit()
    session.refresh(key)
    return KeyInfo(id=key.id, name=key.name, created_at=key.created_at, last_used_at=key.last_used_at,
                   revoked_at=key.revoked_at, jobs_cancelled=cancelled, jobs_stopping=stopping)


def create_api_key(*, session: Session, name: str) -> str:
    """Store a new key named ``name`` and return it; only its hash is kept."""
    name = name.strip()
    if not name or len(name) > 200:
        raise InvalidRequestError("a key name must be 1 to 200 characters")
    new = generate_key()
    repository.add_api_key(session, key_id=new.id, name=name, key_hash=new.key_hash)
    session.commit()
    return new.key


@dataclass(frozen=True)
class Principal:
    """Who a request acts for: the id of the key it presented (or of the ``--no-auth`` principal)."""

    id: str
    name: str


class KeyCache:
    """Keys checked in the last ``ttl_s`` seconds, so a busy poller costs no key lookup per request.

    Entries are keyed by the key's sha256 and live ``ttl_s`` (at most 1 s, :class:`Settings`), so a
    key revoked in the database is refused within that time by every API process. Only successful
    checks are kept; a wrong key always goes to the database.
    """

    MAX_ENTRIES = 10_000

    def __init__(self, ttl_s: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._entries: dict[str, tuple[float, Principal]] = {}
        self._lock = threading.Lock()

    def get(self, key: str) -> Principal | None:
        if self.ttl_s <= 0:
            return None
        digest = hash_key(key)
        entry = self._entries.get(digest)
        if entry is None:
            return None
        if self._clock() >= entry[0]:
            self._entries.pop(digest, None)
            return None
        return entry[1]

    def put(self, key: str, principal: Principal) -> None:
        if self.ttl_s <= 0:
            return
        with self._lock:
            if len(self._entries) >= self.MAX_ENTRIES:
                self._entries.clear()
            self._entries[hash_key(key)] = (self._clock() + self.ttl_s, principal)


def authenticate(*, session: Session, key: str) -> ApiKey:
    """The live key row that ``key`` matches; AuthenticationError otherwise.

    A wrong key costs the same whether or not the id it names exists, so the answer's timing does not
    tell which ids do: either way one read that answers one string (the stored hash, or a dummy hash
    for an unknown id) and one constant-time comparison with it. Only a key that matches loads its row.
    """
    key_id = key_id_of(key)
    matched: str | None = None  # the id of the stored key that ``key`` is
    if key_id is not None and key_id != LOCAL_PRINCIPAL_ID:
        if key_matches(key, repository.api_key_hash(session, key_id=key_id, default=_NO_KEY_HASH)):
            matched = key_id
    else:
        key_matches(key, _NO_KEY_HASH)  # not a key's shape: the same comparison, and never a match
    row = repository.get_api_key(session, key_id=matched) if matched is not None else None
    if row is None or row.revoked_at is not None:
        raise AuthenticationError("the API key is not valid; create one with `cahp keys create --name NAME`")
    now = utcnow()
    last = row.last_used_at
    if last is None or (now - last).total_seconds() >= LAST_USED_EVERY_S:
        repository.touch_api_key(session, key_id=row.id, now=now, every_s=LAST_USED_EVERY_S)
    return row
