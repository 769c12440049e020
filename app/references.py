"""Model and dataset references: parsing them and checking them when a job is submitted.

========================  ===========================================================================
``hf://org/name``         a hub model (for a dataset reference: a hub dataset)
``hf://datasets/org/name`` a hub dataset
``file:///path``          a directory, archive or (datasets only) split file under an allowed root
``upload://id``           an upload of the same API key: an archive, or (datasets only) a split file
``s3://bucket/key``       an object or a key prefix under one of ``CAHP_ALLOWED_S3_PREFIXES``
========================  ===========================================================================

Submit-time checks are what the API can answer at once (syntax, allowed roots, ownership of
uploads). The worker turns a reference into a local path or hub id (:mod:`worker.inputs`) and
checks ``file://`` roots again, since a path can change between submit and run.
"""

from __future__ import annotations

import os
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
_HUB_ID = re.compile(rf"^{_HUB_PART}(/{_HUB_PART})?\Z")
_UPLOAD_ID = re.compile(r"^[0-9a-f]{32}\Z")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]\Z")


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
        With the accepted forms when ``uri`` matches none of them, or when it holds a NUL or
        another control character anywhere (also once ``%``-decoded).
    """
    if _has_control(uri):
        raise InvalidReferenceError(f"the {role} reference holds a NUL or another control character; remove it")
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
        path = unquote(parts.path)
        if _has_control(path):
            raise InvalidReferenceError(f"{uri!r} decodes to a path with a NUL or another control character")
        return Reference(uri, "file", path)
    if scheme == "upload":
        if not _UPLOAD_ID.match(rest):
            raise InvalidReferenceError(f"{uri!r} is not an upload URI; POST /v1/uploads answers one")
        return Reference(uri, "upload", rest)
    if scheme == "s3":
        bucket, _, key = rest.partition("/")
        if not _BUCKET.match(bucket) or not key:
            raise InvalidReferenceError(f"{uri!r} must be s3://bucket/key with a valid bucket name and a key")
        segments = key.rstrip("/").split("/")
        if any(part in ("", ".", "..") for part in segments):
            raise InvalidReferenceError(f"{uri!r} has an empty, '.' or '..' part in its key; name the object plainly")
        return Reference(uri, "s3", rest)
    raise InvalidReferenceError(_forms(role, f"unknown scheme {scheme!r} in {uri!r}"))


def _has_control(text: str) -> bool:
    return any(ord(c) < 0x20 or ord(c) == 0x7F for c in text)


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


def _outside_roots(path: str) -> InvalidReferenceError:
    # The same words whether or not the path exists, and without naming the roots: a caller learns
    # nothing about the server's files outside the directories it may read.
    return InvalidReferenceError(
        f"file://{path} is not in a directory this server may read; ask the operator which directories "
        "CAHP_ALLOWED_LOCAL_ROOTS allows, or upload the files with POST /v1/uploads"
    )


def _under_roots(path: Path, settings: Settings) -> bool:
    return any(path.is_relative_to(root) for root in settings.allowed_local_roots)


def resolve_local(path: str, settings: Settings) -> Path:
    """Resolve a ``file://`` path, following symlinks, and require it to be under an allowed root.

    Only a path that resolves inside a root is said to be missing; anything else gets one message.
    """
    if not settings.allowed_local_roots:
        raise InvalidReferenceError(
            "file:// references are disabled on this server; an operator can allow directories with "
            "CAHP_ALLOWED_LOCAL_ROOTS, or upload the files with POST /v1/uploads"
        )
    try:
        resolved = Path(path).resolve(strict=False)
    except (RuntimeError, OSError, ValueError) as exc:  # a symlink loop, or a name the OS refuses
        raise _outside_roots(path) from exc
    if not _under_roots(resolved, settings):
        raise _outside_roots(path)
    if not resolved.exists():
        raise InvalidReferenceError(f"file://{path} does not exist on the server")
    check_local_tree(resolved, settings, shown=path)
    return resolved


def check_local_tree(path: Path, settings: Settings, *, shown: str) -> None:
    """Require every file under the directory ``path`` to resolve inside an allowed root.

    A symlink inside a root may point anywhere; what is read is where it leads, so each entry is
    resolved (directories reached through links are walked too, once each). The walk stops at
    ``CAHP_MAX_ARCHIVE_MEMBERS`` entries.
    """
    if not path.is_dir():
        return
    seen: set[str] = set()
    count = 0
    for directory, dirnames, filenames in os.walk(path, followlinks=True):
        real_dir = os.path.realpath(directory)
        if real_dir in seen:
            dirnames[:] = []
            continue
        seen.add(real_dir)
        for name in (*dirnames, *filenames):
            count += 1
            if count > settings.max_archive_members:
                raise InvalidReferenceError(
                    f"file://{shown} holds more than {settings.max_archive_members} files; point at a smaller directory"
                )
            entry = Path(directory, name)
            if entry.is_symlink() and not _under_roots(Path(os.path.realpath(entry)), settings):
                relative = entry.relative_to(path).as_posix()
                raise InvalidReferenceError(
                    f"file://{shown}: {relative!r} is a link that leads out of the directories this server may "
                    "read; copy the file itself there"
                )


def check_s3_reference(ref: Reference, settings: Settings) -> tuple[str, str]:
    """``(bucket, key)`` of an ``s3://`` reference this server may read, else InvalidReferenceError.

    Readable: under one of ``CAHP_ALLOWED_S3_PREFIXES`` (empty: no ``s3://`` inputs at all) and
    not inside the artifact store's own bucket and prefix, which holds every key's uploads and
    results.
    """
    bucket, _, key = ref.target.partition("/")
    if not settings.allowed_s3_prefixes:
        raise InvalidReferenceError(
            f"{ref.uri}: s3:// references are disabled on this server; an operator can allow buckets or prefixes "
            "with CAHP_ALLOWED_S3_PREFIXES, or upload the files with POST /v1/uploads"
        )
    store = settings.resolved_artifact_store
    if store.startswith("s3://"):
        store_bucket, _, store_prefix = store[len("s3://"):].partition("/")
        if bucket == store_bucket and _key_under(key, store_prefix):
            raise InvalidReferenceError(
                f"{ref.uri} names the artifact store's own objects, which no job may read; reference a file "
                "in your own bucket, or upload it with POST /v1/uploads"
            )
    for allowed in settings.allowed_s3_prefixes:
        allowed_bucket, _, allowed_prefix = allowed.partition("/")
        if bucket == allowed_bucket and _key_under(key, allowed_prefix):
            return bucket, key
    raise InvalidReferenceError(
        f"{ref.uri} is not under a bucket or prefix this server may read; ask the operator which ones "
        "CAHP_ALLOWED_S3_PREFIXES allows, or upload the files with POST /v1/uploads"
    )


def _key_under(key: str, prefix: str) -> bool:
    """Whether ``key`` is ``prefix`` or below it, as a directory (``a/b`` is not under ``a/bc``)."""
    prefix = prefix.strip("/")
    return not prefix or key.rstrip("/") == prefix or key.startswith(prefix + "/")


def check_reference(
    ref: Reference, *, role: Role, settings: Settings, session: Session, owner_id: str
) -> Shape:
    """Submit-time checks of a parsed reference; returns what it holds.

    Raises
    ------
    InvalidReferenceError
        For a ``file://`` path outside the allowed roots (or holding a link out of them), an upload
        this key does not own, an ``s3://`` URI outside ``CAHP_ALLOWED_S3_PREFIXES`` or inside the
        artifact store, or a single file given as a model.
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
        check_s3_reference(ref, settings)
        shape = shape_of_name(ref.target)
    if role == "model" and shape == "file":
        raise InvalidReferenceError(
            f"{ref.uri} is a single file; a model is a directory: pack it as .tar.gz or .zip and upload that"
        )
    return shape
