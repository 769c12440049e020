"""``/v1/uploads``: dataset files and model or dataset archives, streamed under a size limit."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.types import Message, Receive

from app.api.deps import ApiKeyDep, SessionDep, SettingsDep, StoreDep
from app.api.routes.problem_docs import problem_responses
from app.api.schemas import UploadPublic
from app.api.services import uploads
from app.core.errors import InvalidUploadError, PayloadTooLargeError

router = APIRouter(prefix="/v1/uploads", tags=["uploads"])

#: Room for the multipart boundaries and part headers around the file itself.
MULTIPART_OVERHEAD = 64 * 1024

_FILE = {"type": "string", "format": "binary",
         "description": "A .csv/.jsonl/.parquet split file or a .tar.gz/.tgz/.tar/.zip archive"}
_BODY = {
    "required": True,
    "content": {"multipart/form-data": {"schema": {"type": "object", "required": ["file"],
                                                   "properties": {"file": _FILE}}}},
}


def _limited(receive: Receive, limit: int) -> Receive:
    """``receive`` that fails with 413 once the body passes ``limit`` bytes, before reading more."""
    seen = 0

    async def wrapped() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise PayloadTooLargeError(f"the upload is larger than the limit of {limit - MULTIPART_OVERHEAD} bytes")
        return message

    return wrapped


@router.post("", status_code=201, openapi_extra={"requestBody": _BODY},
             responses={200: {"description": "This key already had these bytes: that upload, nothing stored",
                              "model": UploadPublic}, **problem_responses(400, 401, 413, 422, 429, 507)})
async def create_upload(
    request: Request, response: Response, session: SessionDep, store: StoreDep, settings: SettingsDep,
    key: ApiKeyDep,
) -> UploadPublic:
    """Upload one file as the multipart field ``file``; answers the ``upload://`` URI to use in a job.

    Content-addressed per key: bytes this key uploaded before give that upload back (200, not 201).
    """
    limit = settings.max_upload_bytes + MULTIPART_OVERHEAD
    declared = request.headers.get("content-length")
    # ASCII digits only (str.isdigit also accepts "²", which int() refuses); a longer number than
    # int() reads is over any limit.
    if declared is not None and declared.isascii() and declared.isdigit() and (
            len(declared) > 18 or int(declared) > limit):
        raise PayloadTooLargeError(f"the upload is larger than the limit of {settings.max_upload_bytes} bytes")
    # FastAPI's UploadFile parameter would spool the whole body first; this reads it under a limit.
    limited = Request(request.scope, receive=_limited(request.receive, limit))
    form = await limited.form(max_files=1, max_fields=8)
    try:
        file: Any = form.get("file")
        if not isinstance(file, UploadFile):
            raise InvalidUploadError("send the file as the multipart/form-data field `file`")
        stored = await run_in_threadpool(
            uploads.store_upload, session=session, store=store, settings=settings, owner_id=key.id,
            filename=file.filename or "upload", source=file.file,
        )
    finally:
        await form.close()
    if not stored.created:
        response.status_code = 200
    return uploads.to_public(stored.upload)


@router.head("/{digest}", include_in_schema=False)
@router.get("/{digest}", responses=problem_responses(401, 404, 422))
def find_upload(digest: str, session: SessionDep, key: ApiKeyDep) -> UploadPublic:
    """This key's upload of the bytes with this digest (``sha256:<hex>``), or 404: ask before uploading again.

    A client that packs a directory deterministically asks first and sends nothing when the answer
    is 200 (``cahp submit`` does). Only the key's own uploads are found.
    """
    return uploads.to_public(uploads.find_by_digest(session=session, owner_id=key.id, digest=digest))
