"""Creating API keys and finding the key a request presents."""

from __future__ import annotations

from sqlalchemy.orm import Session

from app import repository
from app.errors import AuthenticationError, InvalidRequestError
from app.models import ApiKey
from app.security import LOCAL_PRINCIPAL_ID, generate_key, hash_key, key_id_of, key_matches

#: Compared against when a presented key names no stored key.
_NO_KEY_HASH = hash_key("no key has this value")


def create_api_key(*, session: Session, name: str) -> str:
    """Store a new key named ``name`` and return it; only its hash is kept."""
    name = name.strip()
    if not name or len(name) > 200:
        raise InvalidRequestError("a key name must be 1 to 200 characters")
    new = generate_key()
    repository.add_api_key(session, key_id=new.id, name=name, key_hash=new.key_hash)
    session.commit()
    return new.key


def authenticate(*, session: Session, key: str) -> ApiKey:
    """The live key row that ``key`` matches; AuthenticationError otherwise."""
    key_id = key_id_of(key)
    row = repository.get_api_key(session, key_id=key_id) if key_id and key_id != LOCAL_PRINCIPAL_ID else None
    # The hash comparison runs for unknown ids too, so answering takes as long either way.
    matches = key_matches(key, row.key_hash if row is not None else _NO_KEY_HASH)
    if row is None or row.revoked_at is not None or not matches:
        raise AuthenticationError("the API key is not valid; create one with `cahp keys create --name NAME`")
    return row


def local_principal(*, session: Session) -> ApiKey:
    """The owner of everything on a ``--no-auth`` server."""
    row = repository.ensure_local_principal(session)
    session.commit()
    return row
