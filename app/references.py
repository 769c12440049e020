"""Model and dataset references: parsing them and checking them when a job is submitted.

========================  ===========================================================================
``hf://org/name``         a hub model (for a dataset reference: a hub dataset)
``hf://datasets/org/name`` a hub dataset
``file:///path``          a directory, archive or (datasets only) split file under an allowed root
``upload://id``           an upload of the same API key: an archive, or (datasets only) a split file
``s3://bucket/key``       an object or a key prefix, when the artifact store is S3-compatible
========================  ===========================================================================

Submit-time checks are what the API can answer at once (syntax, allowed roots, ownership of
uploads). The worker turns a reference into a local path or hub id (:mod:`worker.inputs`) and
checks ``file://`` roots again, since a path can change between submit and run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import unquote, urlsplit

from sqlalchemy.orm import Session

from app import repository
from app.archives import archive_suffix
from app.errors import InvalidReferenceError
from app.settings import Settings
from cahp_engine.datasets_io import FILE_SUFFIXES as DATA_SUFFIXES

Role = Literal["model", "dataset"]
Scheme = Literal["hf", "file", "upload", "s3"]
#: What a reference holds: a hub id, a directory, an archive to unpack, or one dataset split file.
Shape = Literal["hub", "directory", "archive", "file"]

_HUB_PART = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}"
_HUB_ID = re.compile(rf"^{_HUB_PART}(/{_HUB_PART})?$")
_UPLOAD_ID = re.compile(r"^[0-9a-f]{32}$")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


@dataclass(frozen=True)
class Reference:
    """A parsed URI: ``target`` is the hub id, local path, upload id or ``bucket/key``."""

    uri: str
    scheme: Scheme
    target: str


def parse_reference(uri: str, *, role: Role) -> Reference:
    """Check the syntax of a model or dataset URI.

    Raises
    ------
    InvalidReferenceError
        With the accepted forms when ``uri`` matches none of them.
    """
    scheme, sep, rest = uri.partition("://")
    if not sep:
        raise InvalidReferenceError(_forms(role, f"{role} reference {uri!r} has no scheme"))
    if scheme == "hf":
        return _parse_hub(uri, rest, role=role)
    if scheme == "file":
        parts = urlsplit(uri)
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise InvalidReferenceError(f"{uri!r} must be an absolute local path like file:///data/models/x")
        if parts.query or parts.fragment:
            raise InvalidReferenceError(f"{uri!r} must not have a query or fragment")
        return Reference(uri, "file", unquote(parts.path))
    if scheme == "upload":
        if not _UPLOAD_ID.match(rest):
            raise InvalidReferenceError(f"{uri!r} is not an upload URI; POST /v1/uploads answers one")
        return Reference(uri, "upload", rest)
    if scheme == "s3":
        bucket, _, key = rest.partition("/")
        if not _BUCKET.match(bucket) or not key:
            raise InvalidReferenceError(f"{uri!r} must be s3://bucket/key with a valid bucket name and a key")
        return Reference(uri, "s3", rest)
    raise InvalidReferenceError(_forms(role, f"unknown scheme {scheme!r} in {uri!r}"))


def _parse_hub(uri: str, rest: str, *, role: Role) -> Reference:
    if rest.startswith("datasets/"):
        if role == "model":
            raise InvalidReferenceError(f"{uri!r} names a hub dataset; a model reference is hf://org/name")
        rest = rest[len("datasets/"):]
    if not _HUB_ID.match(rest) or ".." in rest:
        raise InvalidReferenceError(f"{uri!r} is not a hub id; use hf://org/name")
    return Reference(uri, "hf", rest)


def _forms(role: Role, problem: str) -> str:
    hub = "hf://org/name" if role == "model" else "hf://datasets/org/name"
    return f"{problem}; use {hub}, file:///path, upload://<id> or s3://bucket/key"


def shape_of_name(name: str) -> Shape:
    """Shape from a file or key name: archive and split-file suffixes; anything else a directory."""
    if archive_suffix(name) is not None:
        return "archive"
    if name.lower().endswith(DATA_SUFFIXES):
        return "file"
    return "directory"


def resolve_local(path: str, settings: Settings) -> Path:
    """Resolve a ``file://`` path, following symlinks, and require it to be under an allowed root."""
    if not settings.allowed_local_roots:
        raise InvalidReferenceError(
            "file:// references are disabled on this server; an operator can allow directories with "
            "CAHP_ALLOWED_LOCAL_ROOTS, or upload the files with POST /v1/uploads"
        )
    try:
        resolved = Path(path).resolve(strict=True)
    except (FileNotFoundError, RuntimeError, OSError) as exc:
        raise InvalidReferenceError(f"file://{path} does not exist on the server") from exc
    if not any(resolved.is_relative_to(root) for root in settings.allowed_local_roots):
        roots = ", ".join(str(r) for r in settings.allowed_local_roots)
        raise InvalidReferenceError(
            f"file://{path} is outside the directories this server may read ({roots}); move it under one"
        )
    return resolved


def check_reference(
    ref: Reference, *, role: Role, settings: Settings, session: Session, owner_id: str
) -> Shape:
    """Submit-time checks of a parsed reference; returns what it holds.

    Raises
    ------
    InvalidReferenceError
        For a ``file://`` path outside the allowed roots, an upload this key does not own, an
        ``s3://`` URI without an S3 store, or a single file given as a model.
    """
    shape: Shape
    if ref.scheme == "hf":
        shape = "hub"
    elif ref.scheme == "file":
        path = resolve_local(ref.target, settings)
        shape = "directory" if path.is_dir() else shape_of_name(path.name)
        if shape == "directory" and not path.is_dir():
            raise InvalidReferenceError(
                f"{ref.uri} is a file that is neither an archive ({', '.join(('.tar.gz', '.zip'))}) nor a "
                f"split file ({', '.join(DATA_SUFFIXES)})"
            )
    elif ref.scheme == "upload":
        upload = repository.get_upload(session, upload_id=ref.target, owner_id=owner_id)
        if upload is None:
            raise InvalidReferenceError(f"{ref.uri} is not an upload of this API key; upload the file first")
        shape = "archive" if upload.kind == "archive" else "file"
    else:
        if not settings.s3_store:
            raise InvalidReferenceError(
                f"{ref.uri}: s3:// references need an S3 artifact store (CAHP_ARTIFACT_STORE=s3://...)"
            )
        shape = shape_of_name(ref.target)
    if role == "model" and shape == "file":
        raise InvalidReferenceError(
            f"{ref.uri} is a single file; a model is a directory: pack it as .tar.gz or .zip and upload that"
        )
    return shape
