"""``/v1/artifacts``: artifact downloads through time-limited signed links, without an API key."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query
from fastapi.responses import StreamingResponse

from app.api.deps import SessionDep, SettingsDep, StoreDep
from app.api.routes.jobs import _ARTIFACT_CONTENT
from app.api.routes.problem_docs import problem_responses
from app.api.services import artifacts

router = APIRouter(prefix="/v1/artifacts", tags=["artifacts"])


@router.get(
    "/{job_id}/{name}",
    response_class=StreamingResponse,
    responses={200: {"content": _ARTIFACT_CONTENT, "description": "The artifact's bytes, with its own media type"},
               206: {"content": _ARTIFACT_CONTENT, "description": "The requested byte range (`Content-Range`)"},
               **problem_responses(403, 410, 416, 422)},
)
def download_signed(
    job_id: str,
    name: str,
    session: SessionDep,
    store: StoreDep,
    settings: SettingsDep,
    key: Annotated[str, Query(min_length=1, max_length=32, pattern="^[A-Za-z0-9_-]+$",
                              description="The id of the API key that owns the job")],
    expires: Annotated[int, Query(ge=0, le=2**40, description="The link's expiry, in seconds since 1970 (UTC)")],
    signature: Annotated[str, Query(min_length=64, max_length=64, pattern="^[0-9a-fA-F]{64}$")],
    range_: Annotated[str | None, Header(alias="Range", max_length=200,
                                         description="One byte range, e.g. `bytes=1048576-`")] = None,
    if_range: Annotated[str | None, Header(alias="If-Range", max_length=200)] = None,
) -> StreamingResponse:
    """Stream one artifact through a link from ``signed_url`` in ``GET /v1/jobs/{id}/artifacts``: no key needed.

    403 ``link_invalid`` for a changed link, or one whose job was deleted or whose key was revoked;
    403 ``link_expired`` past its time.
    """
    artifact, span, stream = artifacts.open_signed_artifact(
        session=session, store=store, settings=settings, owner_id=key, job_id=job_id, name=name, expires=expires,
        signature=signature, range_header=range_, if_range=if_range)
    headers = {
        "Content-Length": str(artifact.size if span is None else span.length),
        "ETag": f'"{artifact.sha256}"',
        "Accept-Ranges": "bytes",
        "Content-Disposition": f'attachment; filename="{artifact.name}"',
        # A link is a bearer credential: no shared cache may keep the bytes or the URL's answer.
        "Cache-Control": "private, no-store",
        "Referrer-Policy": "no-referrer",
    }
    if span is not None:
        headers["Content-Range"] = span.content_range(artifact.size)
    return StreamingResponse(stream, status_code=200 if span is None else 206, media_type=artifact.media_type,
                             headers=headers)
