"""``/v1/uploads``: dataset files and model or dataset archives, streamed under a size limit."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
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
             responses=problem_responses(400, 401, 413, 422, 507))
async def create_upload(
    request: Request, session: SessionDep, store: StoreDep, settings: SettingsDep, key: ApiKeyDep
) -> UploadPublic:
    """Upload one file as the multipart field ``file``; answers the ``upload://`` URI to use in a job."""
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
        upload = await run_in_threadpool(
            uploads.store_upload, session=session, store=store, settings=settings, owner_id=key.id,
            filename=file.filename or "upload", source=file.file,
        )
    finally:
        await form.close()
    return uploads.to_public(upload)
