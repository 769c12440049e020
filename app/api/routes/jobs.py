"""``/v1/jobs``: submit, list, read, cancel, logs and artifacts."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import StreamingResponse

from app.api.deps import ApiKeyDep, JobReaderDep, KeyCheckDep, QueueDep, SessionDep, SettingsDep, StoreDep
from app.api.routes.downloads import IfRangeHeader, RangeHeader, download_responses, stream_artifact
from app.api.routes.problem_docs import problem_responses
from app.api.schemas import (
    ArtifactPublic,
    DeliveryPublic,
    JobCheck,
    JobCreate,
    JobPublic,
    LogPage,
    Page,
    RegisterSpec,
    RegistrationPublic,
)
from app.api.services import events, jobs, registrations, webhooks
from app.core.db import JobStatus

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
@router.post("", status_code=202, responses=problem_responses(400, 401, 422, 429, 503))
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


@router.post("/check", responses=problem_responses(400, 401, 422))
def check_job(body: JobCreate, session: SessionDep, settings: SettingsDep, key: ApiKeyDep) -> JobCheck:
    """Check a job as a submit would, without queuing it: 200 with what was checked, or the 422 submit would give.

    The model and dataset are checked with the worker's own checks as far as the API can see them
    (uploads are indexed when they arrive): weights, config family, splits, columns, labels.
    """
    report = jobs.check_job(session=session, settings=settings, owner_id=key.id, body=body)
    return JobCheck(checked=list(report.checked), skipped=list(report.skipped))


@router.get("", responses=problem_responses(401, 422))
def list_jobs(
    session: SessionDep,
    key: ApiKeyDep,
    status: JobStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=jobs.MAX_PAGE)] = 20,
    cursor: Annotated[str | None, Query(max_length=512)] = None,
    label: Annotated[list[str], Query(max_length=320, description="`key:value`; repeat to require several")] = [],  # noqa: B006
) -> Page[JobPublic]:
    """This key's jobs, newest first; follow ``next_cursor`` for more. ``label=key:value`` filters."""
    return jobs.list_jobs(session=session, owner_id=key.id, limit=limit, status=status, cursor=cursor, labels=label)


@router.get("/{job_id}", response_model=JobPublic, responses=problem_responses(401, 404))
async def get_job(job_id: str, reader: JobReaderDep, key: ApiKeyDep) -> Response:
    """Status, stage, progress, times, error and result summary of one job."""
    # The route CI pipelines poll: read in the event loop and answered as JSON bytes, nothing else.
    return Response(await jobs.job_json(reader=reader, owner_id=key.id, job_id=job_id), media_type="application/json")


@router.delete("/{job_id}", status_code=204, responses=problem_responses(401, 404, 409))
def delete_job(job_id: str, session: SessionDep, store: StoreDep, key: ApiKeyDep) -> Response:
    """Delete a finished job with its log and stored artifacts; 409 while it is queued or running."""
    jobs.delete_job(session=session, store=store, owner_id=key.id, job_id=job_id)
    return Response(status_code=204)


@router.post("/{job_id}/cancel", status_code=202, responses=problem_responses(401, 404, 409))
def cancel_job(job_id: str, session: SessionDep, store: StoreDep, key: ApiKeyDep) -> JobPublic:
    """Cancel a queued job now, or stop a running one at its next step."""
    return jobs.to_public(jobs.cancel_job(session=session, store=store, owner_id=key.id, job_id=job_id))


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


@router.get("/{job_id}/artifacts", responses=problem_responses(401, 404, 410))
def list_artifacts(job_id: str, request: Request, session: SessionDep, settings: SettingsDep, store: StoreDep,
                   key: ApiKeyDep) -> Page[ArtifactPublic]:
    """The manifest: name, size, sha256, media type and a time-limited link of each stored artifact.

    ``signed_url`` downloads the artifact without a key until ``signed_url_expires_at``
    (``CAHP_SIGNED_URL_TTL_S``): an S3 presigned URL with an S3 store, else a signed
    ``/v1/artifacts/...`` link of this server. Deleting the job revokes them.
    """
    return jobs.list_artifacts(session=session, owner_id=key.id, job_id=job_id, settings=settings, store=store,
                               base_url=str(request.base_url))


@router.get(
    "/{job_id}/artifacts/{name}",
    response_class=StreamingResponse,
    responses=download_responses(401, 404, 410, 416, 422),
)
def download_artifact(
    job_id: str,
    name: str,
    session: SessionDep,
    store: StoreDep,
    key: ApiKeyDep,
    range_: RangeHeader = None,
    if_range: IfRangeHeader = None,
) -> StreamingResponse:
    """Stream one artifact; ``ETag`` is its sha256. ``Range`` resumes an interrupted download (206)."""
    artifact, span, stream = jobs.open_artifact(session=session, store=store, owner_id=key.id, job_id=job_id,
                                                name=name, range_header=range_, if_range=if_range)
    return stream_artifact(artifact, span, stream)


@router.get(
    "/{job_id}/events",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {"schema": {"type": "string"}}},
                     "description": "Server-Sent Events: `status`, `stage`, `progress` (the job), `target` (a "
                                    "target run's record, once decided) and `log` (a line)"},
               **problem_responses(401, 404, 422, 429)},
)
def job_events(
    job_id: str,
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    key: ApiKeyDep,
    key_check: KeyCheckDep,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", max_length=64,
                                                description="Resume after this event")] = None,
) -> StreamingResponse:
    """The job's state and log as they change, until it has finished; resumable with ``Last-Event-ID``."""
    events.check_job(session, owner_id=key.id, job_id=job_id)
    slot = request.app.state.stream_slots.open(key.id)
    stream = events.job_events(sessions=request.app.state.sessions, owner_id=key.id, job_id=job_id,
                               last_event_id=events.parse_last_event_id(last_event_id),
                               poll_s=settings.events_poll_s, draining=request.app.state.draining,
                               key_valid=key_check)
    # no-transform and X-Accel-Buffering: proxies must pass each event on as it comes, not buffer them.
    headers = {"Cache-Control": "no-cache, no-transform", "X-Accel-Buffering": "no"}
    return StreamingResponse(slot.hold(stream), media_type="text/event-stream", headers=headers)


@router.post("/{job_id}/register", responses=problem_responses(400, 401, 403, 404, 409, 410, 422, 502, 503))
def register_job(job_id: str, session: SessionDep, store: StoreDep, settings: SettingsDep, key: ApiKeyDep,
                 body: RegisterSpec | None = None) -> RegistrationPublic:
    """Register the job's pruned model in the server's MLflow registry as a new version of a named model.

    Without a body, the job's own ``register`` is used. The run logged with it holds the settings,
    figures, MSS curve, head map and report; the version is tagged with the job id, base model and labels.
    """
    return registrations.register_job(session=session, store=store, settings=settings, owner_id=key.id,
                                      job_id=job_id, spec=body)


@router.get("/{job_id}/deliveries", responses=problem_responses(401, 404))
def job_deliveries(job_id: str, session: SessionDep, key: ApiKeyDep) -> Page[DeliveryPublic]:
    """Webhook deliveries of this job's events, with every attempt (status code or error, duration)."""
    return webhooks.list_deliveries(session=session, owner_id=key.id, job_id=job_id)
