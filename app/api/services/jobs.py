"""Submitting, reading, listing and cancelling jobs, and reading their logs and artifacts."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import json
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.api.producer import JobQueue
from app.api.schemas import (
    ArtifactPublic,
    DatasetSpec,
    JobCreate,
    JobError,
    JobLinks,
    JobPublic,
    JobResult,
    LogLine,
    LogPage,
    ModelSpec,
    Page,
    given_params,
)
from app.core import repository
from app.core.db import utcnow
from app.core.errors import (
    IdempotencyKeyReusedError,
    InvalidReferenceError,
    InvalidRequestError,
    JobFinishedError,
    NotFoundError,
    UnavailableError,
)
from app.core.models import Artifact, Job, JobStatus
from app.core.params import dataset_options, stored_params
from app.core.settings import Settings
from app.core.sources import SourceContext, check_reference, parse_reference
from app.core.sources.upload import find_upload
from app.core.storage import ArtifactStore

MAX_PAGE = 100
MAX_LOG_PAGE = 1000
MAX_LOG_OFFSET = 2**31 - 1
_IDEMPOTENCY_KEY_CHARS = set(map(chr, range(0x21, 0x7F)))
#: Hub revisions: branch and tag names (which may hold "/") or commit hashes; no control characters.
_REVISION = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_./-]{0,254}")


@dataclass(frozen=True)
class Submitted:
    job: Job
    created: bool  # False when an Idempotency-Key returned an earlier job


def submit_job(
    *,
    session: Session,
    queue: JobQueue,
    settings: Settings,
    owner_id: str,
    body: JobCreate,
    idempotency_key: str | None = None,
) -> Submitted:
    """Validate a job, record it as ``queued`` and send its id to the workers.

    The database is the source of truth: once the row is committed the job exists. If the broker
    cannot be reached, the job stays ``queued`` and the sweeper sends it when the broker is back
    (:mod:`app.api.sweeper`), so a broker outage delays jobs but loses none.

    Raises
    ------
    ConfigError, DatasetError
        For pruning settings or dataset options out of range (from the engine's own checks).
    InvalidReferenceError
        For a model or dataset URI this server cannot use.
    IdempotencyKeyReusedError
        When ``idempotency_key`` was used before with a different body.
    """
    digest = hashlib.sha256(json.dumps(body.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()
    if idempotency_key is not None:
        _check_idempotency_key(idempotency_key)
        earlier = repository.find_job_by_idempotency_key(session, owner_id=owner_id, key=idempotency_key)
        if earlier is not None:
            return Submitted(_same_request(earlier, digest), created=False)

    params = stored_params(given_params(body.params))
    context = SourceContext(settings=settings, owner_id=owner_id,
                            find_upload=lambda upload_id: find_upload(session, upload_id=upload_id, owner_id=owner_id))
    _validate_dataset(body.dataset, context=context)
    model_ref = parse_reference(body.model.uri, role="model")
    check_reference(model_ref, role="model", context=context)
    if body.model.revision is not None and model_ref.scheme != "hf":
        raise InvalidReferenceError("`model.revision` applies only to hf:// models; remove it")
    if body.model.revision is not None and not _REVISION.fullmatch(body.model.revision):
        raise InvalidReferenceError(
            "`model.revision` must be a branch, tag or commit: letters, digits, `_`, `-`, `.` and `/`"
        )

    job = Job(
        id=uuid.uuid4().hex, owner_id=owner_id, status=JobStatus.queued.value, model_uri=body.model.uri,
        model_revision=body.model.revision, dataset=body.dataset.model_dump(mode="json"), params=params,
        idempotency_key=idempotency_key, request_hash=digest, enqueued_at=utcnow(),
    )
    try:
        repository.add_job(session, job)
        session.commit()
    except IntegrityError:
        # A concurrent request with the same Idempotency-Key won the insert; answer with its job.
        session.rollback()
        earlier = repository.find_job_by_idempotency_key(session, owner_id=owner_id, key=idempotency_key or "")
        if earlier is None:
            raise
        return Submitted(_same_request(earlier, digest), created=False)
    try:
        queue.enqueue(job.id)
    except UnavailableError:
        # Recorded as never sent, so the next sweep sends it without waiting for requeue_after_s.
        repository.mark_not_enqueued(session, job_id=job.id)
        session.commit()
    return Submitted(job, created=True)


def _validate_dataset(spec: DatasetSpec, *, context: SourceContext) -> None:
    dataset_options(spec.model_dump())
    ref = parse_reference(spec.uri, role="dataset")
    shape = check_reference(ref, role="dataset", context=context)
    if spec.eval_uri is None:
        if shape == "file":
            raise InvalidReferenceError(
                f"{spec.uri} is a single file, which holds one split; give the evaluation split as "
                "`dataset.eval_uri`, or upload an archive holding train and test files"
            )
        return
    if shape != "file":
        raise InvalidReferenceError("`dataset.eval_uri` applies only when `dataset.uri` is a single split file")
    eval_ref = parse_reference(spec.eval_uri, role="dataset")
    if check_reference(eval_ref, role="dataset", context=context) != "file":
        raise InvalidReferenceError(f"`dataset.eval_uri` ({spec.eval_uri}) must be a single split file")


def _check_idempotency_key(key: str) -> None:
    if not 1 <= len(key) <= 255 or not set(key) <= _IDEMPOTENCY_KEY_CHARS:
        raise InvalidRequestError("Idempotency-Key must be 1 to 255 visible ASCII characters")


def _same_request(earlier: Job, digest: str) -> Job:
    if earlier.request_hash != digest:
        raise IdempotencyKeyReusedError(
            f"this Idempotency-Key was used for job {earlier.id} with a different request; "
            "use a new key for a new request"
        )
    return earlier


def get_job(*, session: Session, owner_id: str, job_id: str) -> Job:
    job = repository.get_job(session, job_id=job_id, owner_id=owner_id)
    if job is None:
        raise NotFoundError(f"no job {job_id!r} for this API key")
    return job


def list_jobs(
    *, session: Session, owner_id: str, limit: int, status: JobStatus | None = None, cursor: str | None = None
) -> Page[JobPublic]:
    """One page of the key's jobs, newest first."""
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidRequestError(f"`limit` must be between 1 and {MAX_PAGE}, got {limit}")
    before = _decode_cursor(cursor) if cursor else None
    rows = repository.list_jobs(session, owner_id=owner_id, limit=limit + 1, status=status, before=before)
    more = len(rows) > limit
    rows = rows[:limit]
    next_cursor = _encode_cursor(rows[-1]) if more else None
    return Page[JobPublic](data=[to_public(job) for job in rows], next_cursor=next_cursor)


def _encode_cursor(job: Job) -> str:
    raw = json.dumps([job.created_at.isoformat(), job.id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[dt.datetime, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created, job_id = json.loads(raw)
        when = dt.datetime.fromisoformat(created)
        if when.tzinfo is None or not isinstance(job_id, str):
            raise ValueError(cursor)
        return when, job_id
    except (ValueError, TypeError, binascii.Error, json.JSONDecodeError) as exc:
        raise InvalidRequestError("`cursor` is not one this server gave out; start again without it") from exc


def cancel_job(*, session: Session, owner_id: str, job_id: str) -> Job:
    """Cancel a queued job, or ask a running one to stop; cancelling twice is harmless."""
    job = get_job(session=session, owner_id=owner_id, job_id=job_id)
    if job.status in (JobStatus.succeeded.value, JobStatus.failed.value):
        raise JobFinishedError(f"job {job_id} already {job.status}; there is nothing to cancel")
    repository.request_cancel(session, job_id=job_id, owner_id=owner_id)
    session.commit()
    return get_job(session=session, owner_id=owner_id, job_id=job_id)


def read_logs(*, session: Session, owner_id: str, job_id: str, offset: int, limit: int) -> LogPage:
    get_job(session=session, owner_id=owner_id, job_id=job_id)
    if offset < 0:
        raise InvalidRequestError(f"`offset` must be >= 0, got {offset}")
    if not 1 <= limit <= MAX_LOG_PAGE:
        raise InvalidRequestError(f"`limit` must be between 1 and {MAX_LOG_PAGE}, got {limit}")
    lines = repository.read_logs(session, job_id=job_id, offset=offset, limit=limit)
    return LogPage(
        data=[LogLine(offset=row.line, time=row.created_at, message=row.message) for row in lines],
        next_offset=lines[-1].line + 1 if lines else offset,
    )


def list_artifacts(*, session: Session, owner_id: str, job_id: str) -> Page[ArtifactPublic]:
    get_job(session=session, owner_id=owner_id, job_id=job_id)
    rows = repository.list_artifacts(session, job_id=job_id)
    return Page[ArtifactPublic](
        data=[ArtifactPublic(name=a.name, size=a.size, sha256=a.sha256, media_type=a.media_type,
                             url=f"/v1/jobs/{job_id}/artifacts/{a.name}") for a in rows],
        next_cursor=None,
    )


def open_artifact(
    *, session: Session, store: ArtifactStore, owner_id: str, job_id: str, name: str
) -> tuple[Artifact, Iterator[bytes]]:
    """The artifact's row and a stream of its bytes."""
    get_job(session=session, owner_id=owner_id, job_id=job_id)
    artifact = repository.get_artifact(session, job_id=job_id, name=name)
    if artifact is None:
        raise NotFoundError(f"job {job_id} has no artifact {name!r}; GET /v1/jobs/{job_id}/artifacts lists them")
    stream = store.iter_bytes(artifact.storage_key)
    # The bytes stream for as long as the client reads; no database connection is needed meanwhile.
    session.commit()
    return artifact, stream


def to_public(job: Job) -> JobPublic:
    base = f"/v1/jobs/{job.id}"
    return JobPublic(
        id=job.id,
        status=JobStatus(job.status),
        stage=job.stage,
        progress=job.progress,
        cancel_requested=job.cancel_requested,
        model=ModelSpec(uri=job.model_uri, revision=job.model_revision),
        dataset=DatasetSpec.model_validate(job.dataset),
        params=job.params,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        error=JobError(code=job.error_code, message=job.error_message or "") if job.error_code else None,
        result=JobResult.model_validate(job.result) if job.result else None,
        links=JobLinks(self=base, logs=f"{base}/logs", artifacts=f"{base}/artifacts", cancel=f"{base}/cancel"),
    )
