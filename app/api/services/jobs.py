"""Submitting, reading, listing and cancelling jobs, and reading their logs and artifacts."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime as dt
import hashlib
import json
import logging
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.api.background import JobQueue
from app.api.job_reader import JobReader
from app.api.ranges import ByteRange, requested_range
from app.api.result_schemas import JobResult, JobTarget
from app.api.schemas import (
    ArtifactPublic,
    AttemptPublic,
    DatasetSpec,
    JobCreate,
    JobError,
    JobLinks,
    JobPublic,
    LogLine,
    LogPage,
    ModelSpec,
    Page,
    RegisterSpec,
    RegistrationPublic,
    given_params,
)
from app.api.services import quotas
from app.core.db import Artifact, Job, JobStatus, repository, utcnow
from app.core.errors import (
    ArtifactsExpiredError,
    IdempotencyKeyReusedError,
    InvalidRequestError,
    JobFinishedError,
    JobNotFinishedError,
    ResourceNotFoundError,
    UnavailableError,
)
from app.core.inputs import PreflightReport, reference_name
from app.core.inputs.sources import (
    find_upload,
    parse_reference,
)
from app.core.labels import MAX_LABELS, parse_selector
from app.core.metrics import JOBS_SUBMITTED
from app.core.mlflow_registry import check_registry, public_registration, stored_register
from app.core.params import stored_params
from app.core.sandbox import inspection_pool
from app.core.security import ArtifactRef, artifact_link, check_webhook_url, generate_webhook_secret
from app.core.settings import Settings
from app.core.storage import ArtifactStore, job_prefix, resume_prefix

logger = logging.getLogger(__name__)
MAX_PAGE = 100
MAX_LOG_PAGE = 1000
MAX_LOG_OFFSET = 2**31 - 1
_IDEMPOTENCY_KEY_CHARS = set(map(chr, range(0x21, 0x7F)))


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
    (:mod:`app.api.background._sweeper`), so a broker outage delays jobs but loses none.

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
    quotas.check_active_jobs(session, settings, owner_id=owner_id)
    check_job(session=session, settings=settings, owner_id=owner_id, body=body)

    if body.register_ is not None:
        check_registry(settings)
    if body.notify_url is not None:
        check_webhook_url(body.notify_url, allowed_hosts=settings.allowed_outbound_hosts, what="`notify_url`")
        # Deliveries to it are signed with the key's own secret: make it now, so it exists to be read.
        repository.set_key_webhook_secret(session, key_id=owner_id, secret=generate_webhook_secret())

    job = Job(
        id=uuid.uuid4().hex, owner_id=owner_id, status=JobStatus.queued.value, model_uri=body.model.uri,
        model_revision=body.model.revision, dataset=body.dataset.model_dump(mode="json"), params=params,
        idempotency_key=idempotency_key, request_hash=digest, enqueued_at=utcnow(), labels=dict(body.labels),
        notify_url=body.notify_url, name=body.name,
        model_name=reference_name(parse_reference(body.model.uri, role="model"), session=session, owner_id=owner_id),
        dataset_name=reference_name(parse_reference(body.dataset.uri, role="dataset"), session=session,
                                    owner_id=owner_id),
        register=body.register_.model_dump(mode="json") if body.register_ is not None else None,
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
    JOBS_SUBMITTED.inc()
    try:
        queue.enqueue(job.id)
    except UnavailableError:
        # Recorded as never sent, so the next sweep sends it without waiting for requeue_after_s.
        repository.mark_not_enqueued(session, job_id=job.id)
        session.commit()
    return Submitted(job, created=True)


def check_job(*, session: Session, settings: Settings, owner_id: str, body: JobCreate) -> PreflightReport:
    """Every check a submit makes before recording the job: settings, references, and the preflight.

    The preflight (:mod:`app.core.inputs._preflight`) runs the worker's own checks on the model and the
    dataset as far as submit can see them, so a wrong column or a model without weights is a 422 now
    rather than a failed job later. ``POST /v1/jobs/check`` (``cahp submit --check``) runs this alone.

    Raises
    ------
    ConfigError, DatasetError, ModelLoadError, UnsupportedModelError, InvalidReferenceError
        What to change, in the words the worker would use.
    """
    quotas.check_budget_parallel(settings, stored_params(given_params(body.params)))
    # The upload rows are read here; everything that reads a file runs in the inspection sandbox.
    uploads: dict[str, dict[str, Any] | None] = {}
    for uri in (body.model.uri, body.dataset.uri, body.dataset.eval_uri):
        if uri is not None and uri.startswith("upload://"):
            ref = parse_reference(uri, role="dataset")
            row = find_upload(session, upload_id=ref.target, owner_id=owner_id)
            uploads[ref.target] = dataclasses.asdict(row) if row is not None else None
    answer = inspection_pool(settings).run(
        "check_inputs", what="checking the job's model and dataset", settings=settings, owner_id=owner_id,
        model=body.model.model_dump(mode="json"), dataset=body.dataset.model_dump(mode="json"), uploads=uploads)
    return PreflightReport(checked=tuple(answer["checked"]), skipped=tuple(answer["skipped"]))


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


async def job_json(*, reader: JobReader, owner_id: str, job_id: str) -> bytes:
    """The job as JSON (:class:`JobPublic`): one prepared read of its row, no ORM, no thread hand-off."""
    row = await reader.job_row(job_id=job_id, owner_id=owner_id)
    if row is None:
        raise ResourceNotFoundError(f"no job {job_id!r} for this API key")
    # A job never claimed has no attempts: the poll of a queued job stays one read.
    attempts = await reader.attempt_rows(job_id=job_id) if row.started_at is not None else []
    return to_public(row, attempts=attempts).model_dump_json().encode()


def get_job(*, session: Session, owner_id: str, job_id: str) -> Job:
    job = repository.get_job(session, job_id=job_id, owner_id=owner_id)
    if job is None:
        raise ResourceNotFoundError(f"no job {job_id!r} for this API key")
    return job


def list_jobs(
    *,
    session: Session,
    owner_id: str,
    limit: int,
    status: JobStatus | None = None,
    cursor: str | None = None,
    labels: Sequence[str] = (),
) -> Page[JobPublic]:
    """One page of the key's jobs, newest first; ``labels`` are ``key:value`` filters, all must match."""
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidRequestError(f"`limit` must be between 1 and {MAX_PAGE}, got {limit}")
    if len(labels) > MAX_LABELS:
        raise InvalidRequestError(f"at most {MAX_LABELS} `label` filters, got {len(labels)}")
    selectors = [parse_selector(text) for text in labels]
    before = _decode_cursor(cursor) if cursor else None
    rows = repository.list_jobs(session, owner_id=owner_id, limit=limit + 1, status=status, before=before,
                                labels=selectors)
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


def cancel_job(*, session: Session, store: ArtifactStore | None = None, owner_id: str, job_id: str) -> Job:
    """Cancel a queued job, or ask a running one to stop; cancelling twice is harmless.

    A queued job cancelled here ends at once: the resume state an earlier attempt left in ``store``
    (a job handed back by a worker that stopped) go with it.
    """
    job = get_job(session=session, owner_id=owner_id, job_id=job_id)
    if job.status in (JobStatus.succeeded.value, JobStatus.failed.value):
        raise JobFinishedError(f"job {job_id} already {job.status}; there is nothing to cancel")
    was_queued = job.status == JobStatus.queued.value
    repository.request_cancel(session, job_id=job_id, owner_id=owner_id)
    session.commit()
    job = get_job(session=session, owner_id=owner_id, job_id=job_id)
    if was_queued and job.status == JobStatus.cancelled.value and store is not None:
        try:
            store.delete_prefix(resume_prefix(job_id))
        except Exception as exc:  # removed with the job (DELETE) or by the retention rule later
            logger.warning("cannot delete the checkpoints of cancelled job %s: %s", job_id, exc)
    return job


def delete_job(*, session: Session, store: ArtifactStore, owner_id: str, job_id: str) -> None:
    """Remove a finished job: its stored objects first, then its rows (logs, labels, artifacts, events).

    Objects first: if the store fails half-way the job is still there and the delete can be repeated;
    the other order would leave objects no row points at.

    Raises
    ------
    ResourceNotFoundError
        No such job for this key (also on a second delete).
    JobNotFinishedError
        The job is queued or running: cancel it and delete it once it has stopped.
    """
    job = get_job(session=session, owner_id=owner_id, job_id=job_id)
    if not JobStatus(job.status).finished:
        raise JobNotFinishedError(f"job {job_id} is {job.status}; cancel it (POST {job_id}/cancel) and delete it "
                                  "once it has stopped")
    session.commit()
    store.delete_prefix(job_prefix(job_id))
    if not repository.delete_finished_job(session, job_id=job_id, owner_id=owner_id):
        raise ResourceNotFoundError(f"no job {job_id!r} for this API key")
    session.commit()


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


def _kept_artifacts(session: Session, owner_id: str, job_id: str) -> Job:
    job = get_job(session=session, owner_id=owner_id, job_id=job_id)
    if job.artifacts_expired:
        raise ArtifactsExpiredError(f"the artifacts of job {job_id} were deleted by the retention rule "
                                    "(CAHP_ARTIFACT_TTL_DAYS); the job's summary and log are kept")
    return job


def list_artifacts(*, session: Session, owner_id: str, job_id: str, settings: Settings, store: ArtifactStore,
                   base_url: str | None = None) -> Page[ArtifactPublic]:
    """The manifest, each artifact with its time-limited signed link (:mod:`app.core.security._signing`)."""
    _kept_artifacts(session, owner_id, job_id)
    rows = repository.list_artifacts(session, job_id=job_id)
    data = []
    for a in rows:
        link = artifact_link(settings, store, job_id=job_id, owner_id=owner_id,
                             base_url=settings.public_url or base_url,
                             artifact=ArtifactRef(name=a.name, sha256=a.sha256, storage_key=a.storage_key))
        data.append(ArtifactPublic(name=a.name, size=a.size, sha256=a.sha256, media_type=a.media_type,
                                   url=f"/v1/jobs/{job_id}/artifacts/{a.name}",
                                   signed_url=link.url if link else None,
                                   signed_url_expires_at=link.expires_at if link else None))
    return Page[ArtifactPublic](data=data, next_cursor=None)


def open_artifact(
    *, session: Session, store: ArtifactStore, owner_id: str, job_id: str, name: str,
    range_header: str | None = None, if_range: str | None = None,
) -> tuple[Artifact, ByteRange | None, Iterator[bytes]]:
    """The artifact's row, the byte range asked for (None: all of it) and a stream of those bytes."""
    _kept_artifacts(session, owner_id, job_id)
    artifact = repository.get_artifact(session, job_id=job_id, name=name)
    if artifact is None:
        raise ResourceNotFoundError(
            f"job {job_id} has no artifact {name!r}; GET /v1/jobs/{job_id}/artifacts lists them")
    span = requested_range(range_header, size=artifact.size, etag=etag_of(artifact), if_range=if_range)
    stream = (store.iter_bytes(artifact.storage_key) if span is None
              else store.iter_bytes(artifact.storage_key, span.start, span.end))
    # The bytes stream for as long as the client reads; no database connection is needed meanwhile.
    session.commit()
    return artifact, span, stream


def etag_of(artifact: Artifact) -> str:
    return f'"{artifact.sha256}"'


def _eta(job: Job | Row[Any]) -> tuple[float | None, str | None]:
    """``eta_s`` as shown, and why it is null: never a stale figure while no live worker holds the job."""
    if job.status == JobStatus.queued.value:
        again = " (an earlier attempt ended; the next one resumes from its checkpoints)" if job.started_at else ""
        return None, "queued: waiting for a worker" + again
    if job.status != JobStatus.running.value:
        return None, None
    lease = job.lease_expires_at
    if lease is not None and (lease if lease.tzinfo else lease.replace(tzinfo=dt.UTC)) < utcnow():
        return None, ("its worker stopped renewing its lease: the job goes back to the queue when the sweeper "
                      "notices, and another worker resumes it")
    if job.eta_s is None:
        return None, ("measuring this attempt's pace: an estimate comes once its first stage has been timed "
                      "(seconds into a stage)")
    return float(job.eta_s), None


def to_public(job: Job | Row[Any], *, attempts: Sequence[Any] | None = None) -> JobPublic:
    """The API's view of a job, from its ORM object or a plain row of its columns.

    ``attempts``: the job's attempt rows (:func:`~app.core.db.repository.attempt_rows`), for a plain row;
    an ORM object brings its own.
    """
    base = f"/v1/jobs/{job.id}"
    if attempts is None:
        # A job never claimed has no attempts: a submit's answer makes no second query (100 at once must
        # not starve the connection pool).
        attempts = job.attempt_history if isinstance(job, Job) and job.started_at is not None else []
    eta, eta_reason = _eta(job)
    return JobPublic(
        id=job.id,
        status=JobStatus(job.status),
        stage=job.stage,
        progress=job.progress,
        eta_s=eta,
        eta_reason=eta_reason,
        cancel_requested=job.cancel_requested,
        model=ModelSpec(uri=job.model_uri, revision=job.model_revision),
        dataset=DatasetSpec.model_validate(job.dataset),
        params=job.params,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        error=JobError(code=job.error_code, message=job.error_message or "") if job.error_code else None,
        result=JobResult.model_validate(job.result) if job.result else None,
        target=JobTarget.model_validate(job.target) if job.target else None,
        labels=job.labels or {},
        notify_url=job.notify_url,
        artifacts_expired=bool(job.artifacts_expired),
        name=job.name,
        model_name=(job.result or {}).get("base_model") or job.model_name,
        dataset_name=(job.result or {}).get("dataset") or job.dataset_name,
        register=RegisterSpec.model_validate(stored_register(job.register)) if job.register else None,
        registration=(RegistrationPublic.model_validate(public_registration(job.registration))
                      if job.registration else None),
        registrations=[RegistrationPublic.model_validate(public_registration(r))
                       for r in repository.registrations_of(job.registration, job.registration_history)],
        attempts=[AttemptPublic.model_validate({
            "number": a.number, "worker": a.worker_id, "started_at": a.started_at, "ended_at": a.ended_at,
            "end": a.end_reason, "resumed_from": a.resumed_from}) for a in attempts],
        links=JobLinks(self=base, logs=f"{base}/logs", artifacts=f"{base}/artifacts", cancel=f"{base}/cancel",
                       events=f"{base}/events", deliveries=f"{base}/deliveries"),
    )
