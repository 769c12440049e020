"""API keys: how they are made, stored and checked.

A key reads ``cahp_<id>_<secret>``. The id names the row; the row holds only the sha256 of the
whole key. A plain hash suffices (no password stretching) because the secret is 256 random bits,
not something a person chose; the comparison is constant-time.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

KEY_PREFIX = "cahp"
_KEY = re.compile(r"^cahp_([a-z0-9]{12})_([A-Za-z0-9_-]{43})\Z")
#: Owner of every job and upload when the server runs with ``--no-auth``.
LOCAL_PRINCIPAL_ID = "local"


@dataclass(frozen=True)
class NewKey:
    id: str
    key: str
    key_hash: str


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def generate_key() -> NewKey:
    """A fresh key: its row id, the key to show once, and the hash to store."""
    key_id = "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(12))
    key = f"{KEY_PREFIX}_{key_id}_{secrets.token_urlsafe(32)}"
    return NewKey(id=key_id, key=key, key_hash=hash_key(key))


def key_id_of(key: str) -> str | None:
    """The row id a well-formed key names, or None for anything else."""
    match = _KEY.match(key)
    return match.group(1) if match else None


def key_matches(key: str, stored_hash: str) -> bool:
    return hmac.compare_digest(hash_key(key), stored_hash)


def generate_webhook_secret() -> str:
    """A Standard Webhooks signing secret: ``whsec_`` and 32 random bytes in base64."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
