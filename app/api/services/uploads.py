"""Storing uploaded dataset files and model or dataset archives.

The client's file name only decides the kind (by its suffix) and is kept for display; the stored
object's name is generated. Archives are checked member by member before they are accepted, so an
unsafe archive is refused at upload time rather than when a job runs.

An upload either completes or leaves nothing. The file is first written to the spool directory;
then the row is recorded as incomplete, the object stored, and the row marked complete. Only
complete uploads can be used. If the API dies in between, the sweeper removes the incomplete row,
its object and the spool file after ``CAHP_UPLOAD_STALE_S`` (:mod:`app.api.background._sweeper`).
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import PurePosixPath, PureWindowsPath
from typing import BinaryIO

from sqlalchemy.orm import Session

from app.api.schemas import UploadPublic
from app.api.services import quotas
from app.core.db import Upload, repository
from app.core.errors import (
    InvalidRequestError,
    InvalidUploadError,
    PayloadTooLargeError,
    ResourceNotFoundError,
    UnavailableError,
)
from app.core.inputs import ARCHIVE_SUFFIXES, archive_suffix, storage_error
from app.core.sandbox import inspection_pool
from app.core.settings import Settings
from app.core.storage import ArtifactStore
from cahp_engine.data import FILE_SUFFIXES as DATA_SUFFIXES

MEDIA_TYPES = {".csv": "text/csv", ".jsonl": "application/jsonl", ".parquet": "application/vnd.apache.parquet",
               ".zip": "application/zip", ".tar": "application/x-tar", ".tar.gz": "application/gzip",
               ".tgz": "application/gzip"}
_CHUNK = 1024 * 1024
_SHA256 = re.compile(r"[0-9a-f]{64}")
logger = logging.getLogger(__name__)


def classify(filename: str) -> tuple[str, str]:
    """``(kind, suffix)`` of an upload from its name: ``archive`` or ``data``; else InvalidUploadError."""
    suffix = archive_suffix(filename)
    if suffix is not None:
        return "archive", suffix
    lower = filename.lower()
    data = next((s for s in DATA_SUFFIXES if lower.endswith(s)), None)
    if data is not None:
        return "data", data
    accepted = ", ".join((*DATA_SUFFIXES, *ARCHIVE_SUFFIXES))
    raise InvalidUploadError(f"cannot tell what {filename!r} is from its name; accepted suffixes: {accepted}")


def store_upload(
    *,
    session: Session,
    store: ArtifactStore,
    settings: Settings,
    owner_id: str,
    filename: str,
    source: BinaryIO,
) -> StoredUpload:
    """Copy ``source`` into the store as a new upload of ``owner_id``, or find the same bytes already stored.

    Uploads are content-addressed per key: bytes the key uploaded before (same sha256 and suffix) give
    that upload back, so repeating an upload is harmless and its ``upload://`` URI is stable. Uploads
    are checked and indexed as they arrive (:mod:`app.core.inputs._upload_contents`), in the inspection
    sandbox (:mod:`app.core.sandbox`), for the checks at submit.

    Raises
    ------
    PayloadTooLargeError
        When ``source`` holds more than ``CAHP_MAX_UPLOAD_BYTES``.
    QuotaExceededError
        When the key's stored uploads would pass ``CAHP_MAX_UPLOAD_BYTES_PER_KEY``.
    InvalidUploadError
        For an empty file, an unknown suffix, or an unsafe or corrupt archive.
    InspectionLimitError
        When inspecting the file reached a limit of the sandbox (nothing is stored).
    """
    # Only the last path component of the client's name is kept, whatever its path syntax.
    display = PureWindowsPath(PurePosixPath(filename).name).name.strip() or "upload"
    kind, suffix = classify(display)
    upload_id = uuid.uuid4().hex
    limit = settings.max_upload_bytes
    settings.spool_dir.mkdir(parents=True, exist_ok=True)
    local = settings.spool_dir / f"{upload_id}{suffix}"
    try:
        digest, size = hashlib.sha256(), 0
        try:
            with open(local, "wb") as out:
                while chunk := source.read(_CHUNK):
                    size += len(chunk)
                    if size > limit:
                        raise PayloadTooLargeError(f"the upload is larger than the limit of {limit} bytes")
                    digest.update(chunk)
                    out.write(chunk)
        except OSError as exc:
            full = storage_error(exc, "receiving the upload")
            if full is None:
                raise
            logger.error("upload %s: %s (%s)", upload_id, full, exc)
            raise full from exc
        if size == 0:
            raise InvalidUploadError(f"{display} is empty")
        # One request at a time per key and content: of identical uploads sent at once, the first stores
        # the bytes and the others, waiting here, find its upload (the check and the store are one step).
        with _same_content(owner_id, digest.hexdigest(), suffix):
            # The same bytes again (a re-run CI step): the upload this key already has (checked and indexed
            # when it came), nothing stored twice. A fresh transaction sees an upload completed meanwhile.
            session.commit()
            same = repository.find_upload_by_digest(session, owner_id=owner_id, sha256=digest.hexdigest(),
                                                    suffix=suffix)
            if same is not None:
                return StoredUpload(same, created=False)
            quotas.check_upload_bytes(session, settings, owner_id=owner_id, incoming=size)
            # Checked (an archive member by member) and indexed in the inspection sandbox, never here: a
            # hostile file costs a bounded child process, and a limit reached refuses the upload.
            contents = inspection_pool(settings).run(
                "index_upload", what=f"inspecting {display[:100]!r}", local=str(local), kind=kind, suffix=suffix,
                shown=display[:100], settings=settings)
            key = f"uploads/{upload_id}{suffix}"
            upload = Upload(id=upload_id, owner_id=owner_id, kind=kind, filename=display[:255], suffix=suffix,
                            media_type=MEDIA_TYPES[suffix], size=size, sha256=digest.hexdigest(), storage_key=key,
                            contents=contents)
            repository.add_upload(session, upload)
            session.commit()  # recorded as incomplete before the object exists, so a crash leaves a trace
            try:
                store.put_file(key, local, media_type=MEDIA_TYPES[suffix])
            except Exception as exc:
                repository.delete_upload(session, upload_id=upload_id)
                session.commit()
                _remove_quietly(store, key)
                logger.warning("storing upload %s failed: %s", upload_id, exc)
                full = storage_error(exc, "storing the upload") if isinstance(exc, OSError) else None
                if full is not None:
                    raise full from exc
                raise UnavailableError("the upload could not be stored; try again shortly") from exc
            repository.complete_upload(session, upload_id=upload_id)
            session.commit()
    finally:
        local.unlink(missing_ok=True)
    return StoredUpload(upload, created=True)


_CONTENT_LOCKS: dict[tuple[str, str, str], tuple[threading.Lock, int]] = {}
_CONTENT_LOCKS_GUARD = threading.Lock()


@contextmanager
def _same_content(owner_id: str, sha256: str, suffix: str) -> Iterator[None]:
    """Hold the lock of one key's upload of these bytes (in this API process), made and dropped on demand."""
    name = (owner_id, sha256, suffix)
    with _CONTENT_LOCKS_GUARD:
        lock, users = _CONTENT_LOCKS.get(name, (threading.Lock(), 0))
        _CONTENT_LOCKS[name] = (lock, users + 1)
    try:
        with lock:
            yield
    finally:
        with _CONTENT_LOCKS_GUARD:
            lock, users = _CONTENT_LOCKS[name]
            if users <= 1:
                del _CONTENT_LOCKS[name]
            else:
                _CONTENT_LOCKS[name] = (lock, users - 1)


@dataclass(frozen=True)
class StoredUpload:
    """An upload, and whether this request stored it (False: the key already had the same bytes)."""

    upload: Upload
    created: bool


def find_by_digest(*, session: Session, owner_id: str, digest: str) -> Upload:
    """This key's newest upload of the bytes whose sha256 is ``digest`` (``sha256:<64 hex digits>``).

    Raises
    ------
    InvalidRequestError
        For a digest not written ``sha256:`` and 64 lower-case hex digits.
    ResourceNotFoundError
        When this key has no such upload (another key's never counts).
    """
    algorithm, _, hexdigest = digest.partition(":")
    if algorithm != "sha256" or not _SHA256.fullmatch(hexdigest):
        raise InvalidRequestError(f"{digest[:80]!r} is not a digest; write sha256: and the 64 lower-case hex digits")
    upload = repository.find_upload_by_digest(session, owner_id=owner_id, sha256=hexdigest)
    if upload is None:
        raise ResourceNotFoundError(
            f"this API key has no upload with {algorithm}:{hexdigest}; POST /v1/uploads to add it")
    return upload


def _remove_quietly(store: ArtifactStore, key: str) -> None:
    try:
        store.delete(key)
    except Exception as exc:  # the row is gone; the sweeper has nothing left to find, so say so
        logger.warning("could not remove the partial upload object %s: %s", key, exc)


def to_public(upload: Upload) -> UploadPublic:
    return UploadPublic(id=upload.id, uri=f"upload://{upload.id}", kind=upload.kind,  # type: ignore[arg-type]
                        filename=upload.filename, size=upload.size, sha256=upload.sha256,
                        media_type=upload.media_type, created_at=upload.created_at)
