"""``/v1/jobs``: submit, list, read, cancel, logs and artifacts."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Response
from fastapi.responses import StreamingResponse

from app.api.deps import ApiKeyDep, QueueDep, SessionDep, SettingsDep, StoreDep
from app.api.routes.problem_docs import problem_responses
from app.api.schemas import ArtifactPublic, JobCreate, JobPublic, LogPage, Page
from app.api.services import jobs
from app.core.models import JobStatus
from app.core.storage import ARTIFACT_MEDIA_TYPES

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
#: An artifact is served with its own media type; the JSON ones (report, MSS curve, head map) are objects.
_ARTIFACT_CONTENT: dict[str, dict[str, object]] = {
    kind: {"schema": {"type": "object"} if kind == "application/json" else {"type": "string", "format": "binary"}}
    for kind in sorted({*ARTIFACT_MEDIA_TYPES.values(), "application/octet-stream"})
}


@router.post("", status_code=202, responses=problem_responses(400, 401, 422, 503))
def submit_job(
    body: JobCreate,
    response: Response,
    session: SessionDep,
    queue: QueueDep,
    settings: SettingsDep,
    key: ApiKeyDep,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
) -> JobPublic:
    """Queue a pruning job. A repeated request with the same ``Idempotency-Key`` returns the first job."""
    submitted = jobs.submit_job(session=session, queue=queue, settings=settings, owner_id=key.id, body=body,
                                idempotency_key=idempotency_key)
    response.headers["Location"] = f"/v1/jobs/{submitted.job.id}"
    if not submitted.created:
        response.headers["Idempotent-Replayed"] = "true"
    return jobs.to_public(submitted.job)


@router.get("", responses=problem_responses(401, 422))
def list_jobs(
    session: SessionDep,
    key: ApiKeyDep,
    status: JobStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=jobs.MAX_PAGE)] = 20,
    cursor: Annotated[str | None, Query(max_length=512)] = None,
) -> Page[JobPublic]:
    """This key's jobs, newest first; follow ``next_cursor`` for more."""
    return jobs.list_jobs(session=session, owner_id=key.id, limit=limit, status=status, cursor=cursor)


@router.get("/{job_id}", responses=problem_responses(401, 404))
def get_job(job_id: str, session: SessionDep, key: ApiKeyDep) -> JobPublic:
    """Status, stage, progress, times, error and result summary of one job."""
    return jobs.to_public(jobs.get_job(session=session, owner_id=key.id, job_id=job_id))


@router.post("/{job_id}/cancel", status_code=202, responses=problem_responses(401, 404, 409))
def cancel_job(job_id: str, session: SessionDep, key: ApiKeyDep) -> JobPublic:
    """Cancel a queued job now, or stop a running one at its next step."""
    return jobs.to_public(jobs.cancel_job(session=session, owner_id=key.id, job_id=job_id))


@router.get("/{job_id}/logs", responses=problem_responses(401, 404, 422))
def read_logs(
    job_id: str,
    session: SessionDep,
    key: ApiKeyDep,
    # Line numbers are 32-bit integers in the database; a larger offset cannot match and would not bind.
    offset: Annotated[int, Query(ge=0, le=jobs.MAX_LOG_OFFSET)] = 0,
    limit: Annotated[int, Query(ge=1, le=jobs.MAX_LOG_PAGE)] = jobs.MAX_LOG_PAGE,
) -> LogPage:
    """Log lines from ``offset`` on; pass ``next_offset`` back to follow the log."""
    return jobs.read_logs(session=session, owner_id=key.id, job_id=job_id, offset=offset, limit=limit)


@router.get("/{job_id}/artifacts", responses=problem_responses(401, 404))
def list_artifacts(job_id: str, session: SessionDep, key: ApiKeyDep) -> Page[ArtifactPublic]:
    """The manifest: name, size, sha256 and media type of each stored artifact."""
    return jobs.list_artifacts(session=session, owner_id=key.id, job_id=job_id)


@router.get(
    "/{job_id}/artifacts/{name}",
    response_class=StreamingResponse,
    responses={200: {"content": _ARTIFACT_CONTENT, "description": "The artifact's bytes, with its own media type"},
               **problem_responses(401, 404)},
)
def download_artifact(
    job_id: str, name: str, session: SessionDep, store: StoreDep, key: ApiKeyDep
) -> StreamingResponse:
    """Stream one artifact; ``ETag`` is its sha256."""
    artifact, stream = jobs.open_artifact(session=session, store=store, owner_id=key.id, job_id=job_id, name=name)
    headers = {
        "Content-Length": str(artifact.size),
        "ETag": f'"{artifact.sha256}"',
        "Content-Disposition": f'attachment; filename="{artifact.name}"',
    }
    return StreamingResponse(stream, media_type=artifact.media_type, headers=headers)
