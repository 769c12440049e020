"""Time-limited links to a job's artifacts that work without the API key.

A deployer (a model registry, a serving platform, a CI job in another account) should fetch a pruned
model with a link, as it fetches from S3, not with the submitter's key. With the S3 store a link is an
S3 presigned URL (:meth:`app.core.storage.S3Store.presigned_url`). With the local store it is
``/v1/artifacts/{job}/{name}?key=...&expires=...&signature=...``: an HMAC-SHA256, under the service's
signing key (``CAHP_SIGNING_KEY``, else a random key kept in ``CAHP_DATA_DIR/signing.key``), of the id of
the API key that owns the job, the job id, the artifact's name and the expiry time. So a link

- is checked before anything is read: the signature first (the same work whether the job exists or
  not), then the expiry, and only then the rows;
- expires at ``expires`` (``CAHP_SIGNED_URL_TTL_S`` after it was made);
- cannot be changed: another key, job, name, expiry or signature fails the comparison;
- dies with its job: the route reads the artifact's row, which deleting the job removes (and the
  store's object with it, which is what ends an S3 presigned URL);
- dies with its key: the route refuses a link whose key was revoked or no longer owns the job. (An S3
  presigned URL cannot be recalled: it lives until its expiry, at most ``CAHP_SIGNED_URL_TTL_S``.)
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import os
import secrets
import time
from dataclasses import dataclass
from urllib.parse import quote, urlencode

from app.core.errors import LinkExpiredError, LinkInvalidError
from app.core.settings import Settings
from app.core.storage import ArtifactStore

#: The file under ``CAHP_DATA_DIR`` holding the generated signing key when ``CAHP_SIGNING_KEY`` is unset.
KEY_FILE = "signing.key"
#: Where a signed local link points, below the service's address.
LINK_PREFIX = "/v1/artifacts"


@dataclass(frozen=True)
class SignedLink:
    """A link that reads one artifact without a key until ``expires_at``."""

    url: str
    expires_at: dt.datetime


@dataclass(frozen=True)
class ArtifactRef:
    """What a link is made for: the artifact's name, sha256 and where the store keeps it."""

    name: str
    sha256: str
    storage_key: str


def signing_key(settings: Settings) -> bytes:
    """The HMAC key: ``CAHP_SIGNING_KEY``, else the key in ``data_dir/signing.key`` (made once, mode 0600)."""
    if settings.signing_key is not None:
        return settings.signing_key.get_secret_value().encode()
    path = settings.data_dir / KEY_FILE
    try:
        return path.read_bytes().strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_hex(32).encode()
    partial = path.with_name(f".{KEY_FILE}.{secrets.token_hex(4)}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(key)
    try:
        # link() fails if another process made the key first: then everyone uses that one.
        os.link(partial, path)
    except FileExistsError:
        pass
    finally:
        partial.unlink(missing_ok=True)
    return path.read_bytes().strip()


def _signature(key: bytes, owner_id: str, job_id: str, name: str, expires: int) -> str:
    message = "\n".join(("v2", owner_id, job_id, name, str(expires))).encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def local_link(settings: Settings, *, job_id: str, owner_id: str, artifact: ArtifactRef, base_url: str | None,
               now: float | None = None) -> SignedLink:
    """An HMAC-signed ``/v1/artifacts/...`` link for the job's key ``owner_id``, absolute under ``base_url``."""
    expires = int(now if now is not None else time.time()) + settings.signed_url_ttl_s
    signature = _signature(signing_key(settings), owner_id, job_id, artifact.name, expires)
    path = f"{LINK_PREFIX}/{quote(job_id, safe='')}/{quote(artifact.name, safe='')}"
    query = urlencode({"key": owner_id, "expires": expires, "signature": signature})
    return SignedLink(url=f"{(base_url or '').rstrip('/')}{path}?{query}",
                      expires_at=dt.datetime.fromtimestamp(expires, dt.UTC))


def check_local_link(settings: Settings, *, owner_id: str, job_id: str, name: str, expires: int, signature: str,
                     now: float | None = None) -> None:
    """Accept a signed link's signature and expiry, or say why not (nothing is read from the database).

    Raises
    ------
    LinkInvalidError
        The signature does not match the key, the job, the name and the expiry.
    LinkExpiredError
        The link was genuine but its time is up.
    """
    expected = _signature(signing_key(settings), owner_id, job_id, name, expires)
    if not hmac.compare_digest(expected, signature.lower()):
        raise LinkInvalidError("this link's signature does not match it; use the link exactly as it was given, or "
                               "ask for a new one with GET /v1/jobs/{id}/artifacts")
    if (now if now is not None else time.time()) > expires:
        when = dt.datetime.fromtimestamp(expires, dt.UTC).isoformat().replace("+00:00", "Z")
        raise LinkExpiredError(f"this link expired at {when}; ask for a new one with GET /v1/jobs/{job_id}/artifacts")


def artifact_link(settings: Settings, store: ArtifactStore, *, job_id: str, owner_id: str, artifact: ArtifactRef,
                  base_url: str | None) -> SignedLink | None:
    """The artifact's time-limited link: S3 presigned with the S3 store, else signed by this service.

    None when ``CAHP_SIGNED_URL_TTL_S`` is 0 (no links given out).
    """
    ttl = settings.signed_url_ttl_s
    if ttl <= 0:
        return None
    presigned = store.presigned_url(artifact.storage_key, expires_s=ttl, filename=artifact.name)
    if presigned is not None:
        return SignedLink(url=presigned, expires_at=dt.datetime.now(dt.UTC) + dt.timedelta(seconds=ttl))
    return local_link(settings, job_id=job_id, owner_id=owner_id, artifact=artifact, base_url=base_url)
