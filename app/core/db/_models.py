"""The database tables (SQLAlchemy 2 declarative mapping). Every change here needs a migration.

The ``jobs`` row is the source of truth for a job: the broker only carries its id. Statuses move
``queued -> running -> succeeded | failed | cancelled``; ``queued -> cancelled`` is also allowed, and
a running job whose worker stopped renewing its lease goes back to ``queued`` (or ends ``failed`` or
``cancelled``) through the sweeper (:mod:`app.api.background._sweeper`).
"""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from app.core.db._database import Base, UTCDateTime, utcnow


class JobStatus(enum.StrEnum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (JobStatus.succeeded, JobStatus.failed, JobStatus.cancelled)


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    # sha256 of the whole key; the key itself is never stored.
    key_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
    revoked_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime(), default=None)
    # Refreshed at most once a minute per key (see app.core.security._keys), so reads stay reads.
    last_used_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime(), default=None)
    # Standard Webhooks secret (``whsec_...``) that signs deliveries to jobs' own ``notify_url``;
    # made on first use (GET /v1/webhooks/default/secret, or a submit with a notify_url).
    webhook_secret: Mapped[str | None] = mapped_column(String(100), default=None)


class Upload(Base):
    __tablename__ = "uploads"
    # A key's uploads are found by their content: a re-run submit asks for the sha256 before sending.
    __table_args__ = (Index("ix_uploads_owner_sha256", "owner_id", "sha256"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    owner_id: Mapped[str] = mapped_column(ForeignKey("api_keys.id"), index=True)
    # "archive" (tar/zip, unpacked before use) or "data" (one dataset split file).
    kind: Mapped[str] = mapped_column(String(16))
    # The client's file name, for display only; storage uses ``storage_key``.
    filename: Mapped[str] = mapped_column(String(255))
    suffix: Mapped[str] = mapped_column(String(16))
    media_type: Mapped[str] = mapped_column(String(100))
    size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    storage_key: Mapped[str] = mapped_column(String(512))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # Set once the object is stored; until then the upload is invisible, and the sweeper removes
    # one left incomplete by a crash (row and object) after CAHP_UPLOAD_STALE_S.
    completed_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime(), default=None)
    # What the upload holds, read when it arrived (app.core.inputs._upload_contents): an archive's files, its
    # config.json and safetensors headers, its split files' columns and labels. Submit checks a job
    # against it (app.core.inputs._preflight) without reading the object again. None: not indexed.
    contents: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("owner_id", "idempotency_key"),
        CheckConstraint(
            "status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')", name="status_known"
        ),
        CheckConstraint("progress >= 0 AND progress <= 1", name="progress_fraction"),
        # Serves the per-key listing, newest first, with its (created_at, id) cursor.
        Index("ix_jobs_owner_created", "owner_id", "created_at", "id"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    owner_id: Mapped[str] = mapped_column(ForeignKey("api_keys.id"))
    status: Mapped[str] = mapped_column(String(16), default=JobStatus.queued.value, index=True)
    stage: Mapped[str | None] = mapped_column(String(32), default=None)
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    # Seconds the running attempt still needs, by its worker's measured pace (None: not known yet).
    eta_s: Mapped[float | None] = mapped_column(Float, default=None)
    model_uri: Mapped[str] = mapped_column(Text)
    model_revision: Mapped[str | None] = mapped_column(String(255), default=None)
    # The dataset reference and its column/split options, as submitted (JobCreate.dataset).
    dataset: Mapped[dict[str, Any]] = mapped_column(JSON)
    # The full, validated PruningConfig minus ``device`` (the worker's setting).
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    idempotency_key: Mapped[str | None] = mapped_column(String(255), default=None)
    request_hash: Mapped[str] = mapped_column(String(64))
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    # How many times a worker has claimed the job, which one holds it now, and until when: the
    # worker renews the lease with heartbeats; past it, the job may be taken over.
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    worker_id: Mapped[str | None] = mapped_column(String(255), default=None)
    lease_expires_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime(), default=None)
    # When the job id was last sent to the broker (None: not sent); the sweeper re-sends a queued
    # job whose message is gone.
    enqueued_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime(), default=None)
    error_code: Mapped[str | None] = mapped_column(String(64), default=None)
    error_message: Mapped[str | None] = mapped_column(Text, default=None)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
    started_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime(), default=None)
    finished_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime(), default=None)
    # The caller's metadata (commit, branch, model name...): also in ``job_labels``, which the
    # list filters on; this copy is what a read returns.
    labels: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    # Where this job's events are also delivered (Standard Webhooks, signed with the key's
    # ``webhook_secret``).
    notify_url: Mapped[str | None] = mapped_column(Text, default=None)
    # Set when the retention sweep (CAHP_ARTIFACT_TTL_DAYS) removed the artifacts; routes answer 410.
    artifacts_expired: Mapped[bool] = mapped_column(Boolean, default=False)
    # What the model is called: the caller's optional name for it, and the display names of the model
    # and dataset references worked out at submit (a hub id, an uploaded archive's or a directory's name).
    name: Mapped[str | None] = mapped_column(String(200), default=None)
    model_name: Mapped[str | None] = mapped_column(String(255), default=None)
    dataset_name: Mapped[str | None] = mapped_column(String(255), default=None)
    # The MLflow registration the job asked for (JobCreate.register), and how the last one went
    # (app.core.mlflow_registry.RegistrationOutcome as a dict: status, model, version, run id, error).
    register: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    registration: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    # Every registration, oldest first: the job's own, then each one `cahp register` added (None: a row
    # from before the list, whose ``registration`` is its only one).
    registration_history: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, default=None)
    # How many registrations of the job were started (CAHP_MAX_REGISTRATIONS_PER_JOB bounds it).
    registrations: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # A speed or FLOPs target's record (cahp_engine.run.TargetRecord as a dict), written by the worker as soon
    # as the run pruned to it, before recovery; a later attempt writes its own.
    target: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    # Every attempt so far, oldest first (read-only here: the repository writes ``job_attempts``).
    attempt_history: Mapped[list[JobAttempt]] = relationship(
        lazy="selectin", viewonly=True, order_by="JobAttempt.number")


class AttemptEnd(enum.StrEnum):
    """Why an attempt ended."""

    completed = "completed"
    failed = "failed"
    cancelled = "cancelled"
    #: Its worker shut down (SIGTERM) and put the job back in the queue with its resume state.
    handed_back = "handed_back"
    #: Its worker stopped renewing the lease (killed, crashed, cut off from the database).
    lost = "lost"


class JobAttempt(Base):
    """One attempt at a job: which worker, from when to when, why it ended, and where it resumed from.

    ``number`` counts every claim (1, 2, ...), handed-back attempts included, whereas ``Job.attempts``
    gives a handed-back attempt back. A row is open (``ended_at`` null) while its worker holds the job.
    """

    __tablename__ = "job_attempts"
    __table_args__ = (
        UniqueConstraint("job_id", "number"),
        CheckConstraint("end_reason IN ('completed', 'failed', 'cancelled', 'handed_back', 'lost')",
                        name="end_reason_known"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    worker_id: Mapped[str] = mapped_column(String(255))
    started_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
    ended_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime(), default=None)
    end_reason: Mapped[str | None] = mapped_column(String(16), default=None)
    # The saved step the attempt went on from (``recovery_training step 63``); None: from the start.
    resumed_from: Mapped[str | None] = mapped_column(String(255), default=None)


class JobLog(Base):
    __tablename__ = "job_logs"
    __table_args__ = (UniqueConstraint("job_id", "line"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    # 0-based line number within the job's log; ``?offset=`` counts these.
    line: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
    message: Mapped[str] = mapped_column(Text)


class Artifact(Base):
    __tablename__ = "artifacts"
    __table_args__ = (UniqueConstraint("job_id", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(128))
    size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    media_type: Mapped[str] = mapped_column(String(100))
    storage_key: Mapped[str] = mapped_column(String(512))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)


class JobLabel(Base):
    """One label of a job, as a row, so that ``?label=key:value`` is an indexed lookup everywhere."""

    __tablename__ = "job_labels"
    __table_args__ = (Index("ix_job_labels_key_value", "key", "value"),)

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    key: Mapped[str] = mapped_column(String(63), primary_key=True)
    value: Mapped[str] = mapped_column(String(255))


class Webhook(Base):
    """An endpoint that receives the events of every job of one API key."""

    __tablename__ = "webhooks"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    owner_id: Mapped[str] = mapped_column(ForeignKey("api_keys.id"), index=True)
    url: Mapped[str] = mapped_column(Text)
    # Kept as is (not hashed): every delivery is signed with it. Shown to the caller once.
    secret: Mapped[str] = mapped_column(String(100))
    # Event types delivered; empty means all of them.
    events: Mapped[list[str]] = mapped_column(JSON, default=list)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)


class JobEvent(Base):
    """The outbox: an event, written in the transaction of the state change it reports.

    ``payload`` is the exact body every delivery sends, and ``webhook_id`` the ``webhook-id``
    header, so that retries are byte-identical and receivers can deduplicate.
    """

    __tablename__ = "job_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    webhook_id: Mapped[str] = mapped_column(String(40), unique=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    type: Mapped[str] = mapped_column(String(32))
    payload: Mapped[str] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)


class WebhookDelivery(Base):
    """One event on its way to one URL: ``pending`` until a 2xx (``delivered``) or its period ends (``failed``)."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        CheckConstraint("status IN ('pending', 'delivered', 'failed')", name="status_known"),
        # Serves the dispatcher's "what is due" query.
        Index("ix_webhook_deliveries_due", "status", "next_attempt_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    event_id: Mapped[int] = mapped_column(ForeignKey("job_events.id", ondelete="CASCADE"), index=True)
    job_id: Mapped[str] = mapped_column(String(32), index=True)
    # The registered endpoint, or None for the job's own notify_url.
    endpoint_id: Mapped[str | None] = mapped_column(String(32), default=None)
    url: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # Retried until created_at + CAHP_WEBHOOK_RETRY_PERIOD_S (the dispatcher's policy), then ``failed``.
    next_attempt_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
    delivered_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime(), default=None)


class WebhookAttempt(Base):
    """One try at a delivery: when, the receiver's status code or the transport error, and how long."""

    __tablename__ = "webhook_attempts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    delivery_id: Mapped[int] = mapped_column(ForeignKey("webhook_deliveries.id", ondelete="CASCADE"), index=True)
    attempted_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
    status_code: Mapped[int | None] = mapped_column(Integer, default=None)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    duration_ms: Mapped[float] = mapped_column(Float, default=0.0)


class BudgetPiece(Base):
    """One piece of an accuracy budget's search: a candidate trained on to a rung, by any worker of the pool.

    The job's worker (the search) writes the pieces of a rung and waits for their results; a piece is
    claimed like a job (a conditional ``UPDATE`` from ``queued``, or from ``running`` under an expired
    lease) by whichever worker gets its message first, the search's own included, and renewed while it
    runs. A piece belongs to one attempt of its job: a later attempt starts its search again and never
    takes an earlier attempt's pieces (:mod:`worker.candidates`).
    """

    __tablename__ = "budget_pieces"
    __table_args__ = (
        UniqueConstraint("job_id", "attempt", "candidate", "piece"),
        CheckConstraint("status IN ('queued', 'running', 'done', 'cancelled')", name="piece_status_known"),
        Index("ix_budget_pieces_job_attempt", "job_id", "attempt"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    # The job's attempt whose search asked for it.
    attempt: Mapped[int] = mapped_column(Integer)
    # The candidate (a strategy's choice at one k: ``cahp@12``) and its piece number (0, 1, ...).
    candidate: Mapped[str] = mapped_column(String(128))
    piece: Mapped[int] = mapped_column(Integer)
    # The engine's CandidateSpec (which heads, how far to train) and where the candidate's state so far is.
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    resume_from: Mapped[str | None] = mapped_column(Text, default=None)
    status: Mapped[str] = mapped_column(String(16), default="queued")
    worker_id: Mapped[str | None] = mapped_column(String(255), default=None)
    lease_expires_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime(), default=None)
    # Claims so far (a piece whose worker was lost is claimed again).
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # What the piece left: the engine's CandidateResult (without the model) and where its state is now.
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
