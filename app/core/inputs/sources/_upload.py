"""``upload://<id>``: a file uploaded with ``POST /v1/uploads`` by the same API key.

An upload is an archive (model or dataset) or one dataset split file. Another key's upload id is
answered exactly like one that does not exist. A dataset archive's cards (``README.md``,
``.huggingface.yaml``) are read from the stored object at submit and checked as the engine checks
them (:mod:`app.core.inputs._dataset_checks`).
"""

from __future__ import annotations

import re
from pathlib import Path

from sqlalchemy.orm import Session

from app.core.db import repository
from app.core.errors import InvalidReferenceError, ResourceNotFoundError
from app.core.inputs._dataset_checks import check_dataset_archive, ranged_file
from app.core.inputs.sources._base import Fetched, Reference, Role, Shape, SourceContext, UploadInfo
from app.core.storage import open_store

SCHEME = "upload"
_UPLOAD_ID = re.compile(r"[0-9a-f]{32}")


def parse(uri: str, rest: str, *, role: Role) -> Reference:
    if not _UPLOAD_ID.fullmatch(rest):
        raise InvalidReferenceError(f"{uri!r} is not an upload URI; POST /v1/uploads answers one")
    return Reference(uri, SCHEME, rest)


def _shape(upload: UploadInfo) -> Shape:
    return "archive" if upload.kind == "archive" else "file"


def check(ref: Reference, *, role: Role, context: SourceContext) -> Shape:
    upload = context.find_upload(ref.target)
    if upload is None:
        raise InvalidReferenceError(f"{ref.uri} is not an upload of this API key; upload the file first")
    if role == "dataset" and _shape(upload) == "archive" and upload.size:
        store = context.store or context.cache.get("store")
        if store is None:
            store = context.cache["store"] = open_store(context.settings)
        key = upload.storage_key

        def read_range(start: int, end: int) -> bytes:
            return b"".join(store.iter_bytes(key, start, end))

        try:
            with ranged_file(read_range, upload.size) as archive:
                check_dataset_archive(archive, shown=ref.uri, max_members=context.settings.max_archive_members)
        except ResourceNotFoundError as exc:
            raise InvalidReferenceError(f"{ref.uri}: the uploaded file is missing from the store") from exc
    return _shape(upload)


def fetch(ref: Reference, *, dest: Path, context: SourceContext) -> Fetched:
    upload = context.find_upload(ref.target)
    if upload is None:
        raise InvalidReferenceError(f"{ref.uri} no longer exists; upload the file again")
    if context.store is None:
        raise RuntimeError("fetching an upload needs the artifact store in the source context")
    local = dest.with_name(dest.name + upload.suffix)
    try:
        context.store.download(upload.storage_key, local)
    except ResourceNotFoundError as exc:
        raise InvalidReferenceError(f"{ref.uri}: the uploaded file is missing from the store") from exc
    return Fetched(str(local), _shape(upload))


def find_upload(session: Session, *, upload_id: str, owner_id: str) -> UploadInfo | None:
    """The complete upload ``upload_id`` of ``owner_id``, as plain values (None for anyone else's)."""
    upload = repository.get_upload(session, upload_id=upload_id, owner_id=owner_id)
    if upload is None:
        return None
    return UploadInfo(storage_key=upload.storage_key, kind=upload.kind, suffix=upload.suffix, size=upload.size,
                      contents=upload.contents)
