"""What the two artifact downloads share (``/v1/jobs/{id}/artifacts/{name}`` with a key, ``/v1/artifacts/...``
through a signed link): their documented answers, the ``Range`` headers they read, and the streamed answer."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Annotated, Any

from fastapi import Header
from fastapi.responses import StreamingResponse

from app.api.ranges import ByteRange
from app.api.routes.problem_docs import problem_responses
from app.api.services.jobs import etag_of
from app.core.db import Artifact
from app.core.storage import ARTIFACT_MEDIA_TYPES

#: An artifact is served with its own media type; the JSON ones (report, MSS curve, head map) are objects.
ARTIFACT_CONTENT: dict[str, dict[str, object]] = {
    kind: {"schema": {"type": "object"} if kind == "application/json" else {"type": "string", "format": "binary"}}
    for kind in sorted({*ARTIFACT_MEDIA_TYPES.values(), "application/octet-stream"})
}

RangeHeader = Annotated[str | None, Header(alias="Range", max_length=200,
                                           description="One byte range, e.g. `bytes=1048576-`")]
IfRangeHeader = Annotated[str | None, Header(alias="If-Range", max_length=200,
                                             description="The ETag the range belongs to")]


def download_responses(*problems: int) -> dict[int | str, dict[str, Any]]:
    """A download's documented answers: the whole artifact, a byte range, and the problems ``problems``."""
    return {200: {"content": ARTIFACT_CONTENT, "description": "The artifact's bytes, with its own media type"},
            206: {"content": ARTIFACT_CONTENT, "description": "The requested byte range (`Content-Range`)"},
            **problem_responses(*problems)}


def stream_artifact(artifact: Artifact, span: ByteRange | None, stream: Iterator[bytes],
                    headers: Mapping[str, str] = {}) -> StreamingResponse:  # noqa: B006 (read, never changed)
    """The artifact's bytes (``span`` of them: 206), its sha256 as the ``ETag``, and ``headers`` besides."""
    sent = {
        "Content-Length": str(artifact.size if span is None else span.length),
        "ETag": etag_of(artifact),
        "Accept-Ranges": "bytes",
        "Content-Disposition": f'attachment; filename="{artifact.name}"',
        **headers,
    }
    if span is not None:
        sent["Content-Range"] = span.content_range(artifact.size)
    return StreamingResponse(stream, status_code=200 if span is None else 206, media_type=artifact.media_type,
                             headers=sent)
