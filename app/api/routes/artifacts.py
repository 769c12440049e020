"""``/v1/artifacts``: artifact downloads through time-limited signed links, without an API key."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse

from app.api.deps import SessionDep, SettingsDep, StoreDep
from app.api.routes.downloads import IfRangeHeader, RangeHeader, download_responses, stream_artifact
from app.api.services import artifacts

router = APIRouter(prefix="/v1/artifacts", tags=["artifacts"])


@router.get(
    "/{job_id}/{name}",
    response_class=StreamingResponse,
    responses=download_responses(403, 410, 416, 422),
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
    range_: RangeHeader = None,
    if_range: IfRangeHeader = None,
) -> StreamingResponse:
    """Stream one artifact through a link from ``signed_url`` in ``GET /v1/jobs/{id}/artifacts``: no key needed.

    403 ``link_invalid`` for a changed link, or one whose job was deleted or whose key was revoked;
    403 ``link_expired`` past its time.
    """
    artifact, span, stream = artifacts.open_signed_artifact(
        session=session, store=store, settings=settings, owner_id=key, job_id=job_id, name=name, expires=expires,
        signature=signature, range_header=range_, if_range=if_range)
    # A link is a bearer credential: no shared cache may keep the bytes or the URL's answer.
    return stream_artifact(artifact, span, stream,
                           {"Cache-Control": "private, no-store", "Referrer-Policy": "no-referrer"})
