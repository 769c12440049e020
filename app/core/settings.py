"""Every setting of the service, read once from ``CAHP_*`` environment variables.

The API, the worker and the ``cahp`` commands all read the same :class:`Settings` through
:func:`get_settings`, so one set of environment variables describes a whole deployment. Tests build
their own ``Settings(...)`` and hand it to :func:`app.api.main.create_app` or the worker functions.

With nothing set, everything lives under ``CAHP_DATA_DIR`` (default ``./cahp-data``): a SQLite
database, an embedded SQLite broker and a local artifact directory. That is *embedded mode*.
"""

from __future__ import annotations

import ipaddress
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from app.core.machine import machine_memory_bytes
from cahp_engine.config import parse_device
from cahp_engine.data import DEFAULT_MAX_ROWS
from cahp_engine.errors import ConfigError
from cahp_engine.models import DEFAULT_MAX_MODEL_PARAMS

#: Memory one job takes per parameter of its model, measured on a BERT job with recovery (float32
#: weights, gradients and Adam's two moments are 16 bytes per trained parameter; activations and the
#: pruning pass's copies come on top): about 10 bytes per parameter of the model as a whole.
BYTES_PER_PARAMETER = 10
#: Largest job time limit accepted, so a mistyped value cannot hold a GPU for months.
MAX_JOB_TIME_LIMIT_S = 30 * 24 * 3600
#: Defaults of the lease on a running job and of the attempts a job gets (see docs/operations.md).
DEFAULT_LEASE_S = 120.0
DEFAULT_MAX_ATTEMPTS = 3
_S3_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


#: The settings an embedded worker inherits as they are (:meth:`Settings.child_environment`).
_CHILD_FIELDS = ("queue", "device", "job_time_limit_s", "progress_interval_s", "cancel_check_interval_s",
                 "max_unpacked_bytes", "max_archive_members", "max_dataset_rows", "lease_s", "heartbeat_interval_s",
                 "checkpoint_interval_s", "max_attempts", "inspection_workers", "inspection_memory_bytes",
                 "inspection_cpu_s", "inspection_wall_s", "inspection_output_bytes", "max_budget_parallel",
                 "max_registrations_per_job", "signed_url_ttl_s", "mlflow_experiment")
#: ... and those it inherits as comma-separated lists.
_CHILD_LISTS = ("allowed_outbound_hosts", "allowed_s3_prefixes", "registry_groups")


class Settings(BaseSettings):
    """Service settings; each field ``name`` is read from the variable ``CAHP_NAME``.

    Attributes
    ----------
    data_dir : Path
        Home of the embedded database, broker, artifacts and scratch space. Made absolute on load.
    database_url : str or None
        SQLAlchemy URL of the job database; None means SQLite at ``data_dir/cahp.db``.
    broker_url : str or None
        Celery broker, e.g. ``redis://host:6379/0``; None means the embedded SQLite broker at
        ``data_dir/broker.db`` (and ``cahp serve`` starts a worker of its own).
    artifact_store : str or None
        A directory, or ``s3://bucket/prefix`` for an S3-compatible store; None means
        ``data_dir/artifacts``.
    s3_endpoint_url, s3_region : str or None
        Endpoint (MinIO, Ceph, ...) and region of the S3 store; credentials come from the usual
        ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` variables or any other boto3 source.
    allowed_local_roots : tuple of Path
        Directories that ``file://`` references may point into (``os.pathsep``-separated in the
        environment). Empty disables ``file://``.
    max_upload_bytes : int
        Largest accepted upload; larger requests get 413.
    max_unpacked_bytes, max_archive_members : int
        Limits on what one archive may unpack to, against archive bombs.
    max_dataset_rows : int
        Most rows one dataset split may have, or declare in its metadata (a few kilobytes of
        Parquet can declare millions of rows); a larger split fails the job as ``invalid_dataset``
        before its rows are read. Default: the engine's ``DEFAULT_MAX_ROWS`` (2,000,000).
    max_model_params : int or None
        Most parameters a job's model may have (a pruned one: before pruning). At submit, the model's
        weights (counted from their safetensors headers) are compared with it and refused as
        ``model_too_large`` with the memory the job would need; in the worker the model is built on
        PyTorch's ``meta`` device from its ``config.json`` and counted before anything is allocated, and a
        refused model fails the job as ``model_not_loadable`` on its first attempt. Default: derived from
        the worker's memory, ``worker_memory_bytes`` / :data:`BYTES_PER_PARAMETER` (a 24 GB machine:
        2.4e9), at most the engine's ``DEFAULT_MAX_MODEL_PARAMS`` (4e9); setting it overrides that
        (:attr:`model_params_limit` is the value in force).
    worker_memory_bytes : int or None
        The memory a worker has for one job; None: this machine's (its cgroup limit, else its RAM).
    inspection_workers, inspection_memory_bytes, inspection_cpu_s, inspection_wall_s, inspection_output_bytes
        The inspection sandbox (:mod:`app.core.sandbox`): how many child processes inspect uploads and
        submitted inputs at once, and each inspection's address space, CPU seconds, wall time and the
        size of the summary it may return. A limit reached is a 422 naming it.
    job_time_limit_s : int
        Longest a job may run; past it the worker stops the job between steps as ``time_limit``.
    broker_visibility_timeout_s : int or None
        How long Redis waits for an acknowledgement before redelivering a task. Jobs are
        acknowledged when they end, so this must exceed ``job_time_limit_s``; None takes the limit
        plus one hour.
    queue : str
        Name of the Celery queue that jobs are sent to and workers consume.
    device : str
        Where workers run models: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
    hub_token, hub_cache_dir
        Hugging Face token and cache directory for ``hf://`` references.
    progress_interval_s, cancel_check_interval_s : float
        Least time between two progress writes, and between two reads of a job's cancel flag.
    checkpoint_interval_s : float
        A running fine-tuning's resume state (the name is kept for compatibility) is saved to the artifact
        store at its epoch ends, no more often than this (0: every epoch); a worker lost or redeployed costs
        the job at most this plus one epoch.
    work_dir : Path or None
        Worker scratch space for inputs and outputs of running jobs; None means ``data_dir/work``.
    no_auth : bool
        Accept requests without an API key (``cahp serve --no-auth``, loopback binding only).
    lease_s, heartbeat_interval_s : float
        A running job is held by its worker for ``lease_s`` seconds past the last heartbeat; the
        worker renews the lease every ``heartbeat_interval_s`` (at most a third of the lease, so
        two missed beats do not lose a healthy job).
    sweep_interval_s : float
        How often the API's sweeper takes over jobs with expired leases, re-sends queued jobs whose
        message is gone, and removes abandoned uploads. It also runs once at start-up; 0 turns the
        sweeper off in this process (another API process must then run one).
    requeue_after_s : float
        A queued job is re-sent only when no message for it is waiting in the broker and its last
        send is at least this old (a message can be in flight between the API and the broker).
    max_attempts : int
        How many times a job may be started; a job whose worker is lost on its last attempt fails
        with ``worker_lost``.
    upload_stale_s : float
        An upload not completed within this time (the API died while storing it) is removed, with
        its partial files.
    allowed_s3_prefixes : tuple of str
        Buckets or key prefixes (``bucket`` or ``bucket/prefix``, an ``s3://`` in front is accepted)
        that ``s3://`` references may read, ``,``-separated in the environment. Empty (the default)
        disables ``s3://`` inputs. The artifact store's own bucket and prefix are always refused.
    allowed_outbound_hosts : tuple of str
        Host names, addresses or networks (CIDR) that outbound requests (S3 endpoint, hub, webhook
        receivers) may reach even though they are loopback, link-local, multicast, reserved or
        cloud-metadata addresses, or (for webhook receivers) private addresses or this machine's own,
        which are refused otherwise (``,``-separated in the environment).
    artifact_ttl_days : float or None
        Artifacts of jobs that finished longer ago than this are deleted by the sweeper and the job
        is marked ``artifacts_expired``; None (the default) keeps them until the job is deleted.
    key_cache_s : float
        How long the API trusts a key it has checked without asking the database again (at most 1 s,
        so a revoked key is refused within a second; 0 turns the cache off).
    events_poll_s : float
        How often an open event stream (``GET /v1/jobs/{id}/events``) reads the job and new log lines.
    webhook_interval_s : float
        How often the API's dispatcher looks for webhook deliveries that are due; 0 turns it off in
        this process (another API process must then run one).
    webhook_timeout_s : float
        The longest one delivery may take in all: connecting, sending, and reading the receiver's
        status and headers (a receiver that trickles its answer is cut off at this deadline).
    webhook_retry_initial_s, webhook_retry_max_s : float
        Back-off between attempts of a delivery: doubling from the first, capped by the second.
    webhook_retry_period_s : float
        A delivery is retried for this long after its event (default 24 h), then ends ``failed``.
    webhook_max_in_flight : int
        Deliveries one API process sends at once.
    webhook_max_in_flight_per_key : int
        Of those, at most this many for the jobs of one API key, so that one key's slow receivers
        cannot hold up the others' deliveries.
    worker_metrics_port : int or None
        Port on which ``cahp worker`` serves its Prometheus metrics (all its pool processes); None
        serves none (workers started by ``cahp serve`` report through the API's ``/metrics``).
    signed_url_ttl_s : int
        How long the signed artifact links of the manifest and of webhook payloads work (default one
        hour, at most 7 days, S3's own limit); 0 gives out none. Deleting a job revokes its links.
    signing_key : SecretStr or None
        The HMAC key of signed ``/v1/artifacts/...`` links (local artifact store). Every API process
        must share it; None keeps a random key in ``data_dir/signing.key``, made on first use.
    public_url : str or None
        The service's address as deployers reach it (``https://cahp.internal``): signed links in webhook
        payloads are absolute with it; None leaves them relative there (API answers use the request's).
    s3_public_endpoint_url : str or None
        The S3 endpoint deployers reach, when it differs from ``s3_endpoint_url`` (MinIO behind a
        proxy): presigned URLs are made for it. None: ``s3_endpoint_url``.
    mlflow_tracking_uri : str or None
        The MLflow tracking server jobs register models in (``register`` in a job, ``cahp register``);
        None turns registration off. Reached through the outbound guard, as webhook receivers are.
    mlflow_tracking_username, mlflow_tracking_password, mlflow_tracking_token
        The tracking server's credentials (basic auth or a bearer token): the operator's only; a job
        names a model, never a server or a credential.
    mlflow_experiment : str
        The experiment that registration runs are logged under (default ``cahp``).
    max_active_jobs_per_key, max_event_streams_per_key, max_upload_bytes_per_key : int
        Per-key quotas: queued plus running jobs, open event streams (per API process), and bytes of
        stored uploads. A request past one is answered 429 with ``Retry-After``.
    max_budget_parallel : int
        Largest ``budget_parallel`` a job may ask for: how many pieces one search puts in the queue at once.
    max_registrations_per_job : int
        How many times one job may be registered (its own registration and ``POST .../register`` calls).
    registry_groups : tuple of str
        ``group=keyid+keyid`` entries (comma-separated): the keys of a group share the registered models
        any of them created. A key in no group owns the names it created, alone.
    """

    model_config = SettingsConfigDict(env_prefix="CAHP_", extra="ignore", frozen=True)

    data_dir: Path = Path("cahp-data")
    database_url: str | None = None
    broker_url: str | None = None
    artifact_store: str | None = None
    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    allowed_local_roots: Annotated[tuple[Path, ...], NoDecode] = ()
    max_upload_bytes: int = Field(default=2 * 1024**3, ge=1)
    max_unpacked_bytes: int = Field(default=8 * 1024**3, ge=1)
    max_archive_members: int = Field(default=10_000, ge=1)
    max_dataset_rows: int = Field(default=DEFAULT_MAX_ROWS, ge=1)
    max_model_params: int | None = Field(default=None, ge=1)
    worker_memory_bytes: int | None = Field(default=None, ge=64 * 1024**2)
    inspection_workers: int = Field(default=2, ge=1, le=16)
    inspection_memory_bytes: int = Field(default=3 * 1024**3, ge=512 * 1024**2)
    inspection_cpu_s: int = Field(default=60, ge=1, le=3600)
    inspection_wall_s: float = Field(default=120.0, gt=0, le=3600)
    inspection_output_bytes: int = Field(default=1024**2, ge=4096, le=256 * 1024**2)
    job_time_limit_s: int = Field(default=24 * 3600, ge=1, le=MAX_JOB_TIME_LIMIT_S)
    broker_visibility_timeout_s: int | None = Field(default=None, ge=1)
    queue: str = Field(default="cahp", min_length=1, max_length=200)
    device: str = "auto"
    hub_token: SecretStr | None = None
    hub_cache_dir: Path | None = None
    progress_interval_s: float = Field(default=2.0, ge=0)
    cancel_check_interval_s: float = Field(default=2.0, ge=0)
    work_dir: Path | None = None
    no_auth: bool = False
    lease_s: float = Field(default=DEFAULT_LEASE_S, gt=0)
    heartbeat_interval_s: float = Field(default=20.0, gt=0)
    checkpoint_interval_s: float = Field(default=300.0, ge=0)
    sweep_interval_s: float = Field(default=30.0, ge=0)
    requeue_after_s: float = Field(default=60.0, ge=0)
    max_attempts: int = Field(default=DEFAULT_MAX_ATTEMPTS, ge=1, le=100)
    upload_stale_s: float = Field(default=3600.0, gt=0)
    allowed_outbound_hosts: Annotated[tuple[str, ...], NoDecode] = ()
    allowed_s3_prefixes: Annotated[tuple[str, ...], NoDecode] = ()
    artifact_ttl_days: float | None = Field(default=None, gt=0)
    key_cache_s: float = Field(default=1.0, ge=0, le=1.0)
    events_poll_s: float = Field(default=0.5, gt=0, le=60)
    webhook_interval_s: float = Field(default=1.0, ge=0)
    webhook_timeout_s: float = Field(default=10.0, gt=0, le=300)
    webhook_retry_initial_s: float = Field(default=5.0, gt=0)
    webhook_retry_max_s: float = Field(default=3600.0, gt=0)
    webhook_retry_period_s: float = Field(default=24 * 3600.0, gt=0)
    webhook_max_in_flight: int = Field(default=16, ge=1, le=256)
    webhook_max_in_flight_per_key: int = Field(default=4, ge=1, le=256)
    worker_metrics_port: int | None = Field(default=None, ge=1, le=65535)
    signed_url_ttl_s: int = Field(default=3600, ge=0, le=7 * 24 * 3600)
    signing_key: SecretStr | None = None
    public_url: str | None = Field(default=None, pattern=r"^https?://[^\s/?#]+(/[^\s?#]*)?$")
    s3_public_endpoint_url: str | None = None
    mlflow_tracking_uri: str | None = Field(default=None, pattern=r"^https?://[^\s]+$")
    mlflow_tracking_username: str | None = None
    mlflow_tracking_password: SecretStr | None = None
    mlflow_tracking_token: SecretStr | None = None
    mlflow_experiment: str = Field(default="cahp", min_length=1, max_length=200)
    max_active_jobs_per_key: int = Field(default=100, ge=1)
    max_event_streams_per_key: int = Field(default=8, ge=1)
    max_upload_bytes_per_key: int = Field(default=50 * 1024**3, ge=1)
    max_budget_parallel: int = Field(default=8, ge=1, le=64)
    max_registrations_per_job: int = Field(default=10, ge=1)
    registry_groups: Annotated[tuple[str, ...], NoDecode] = ()

    @field_validator("allowed_local_roots", mode="before")
    @classmethod
    def _split_roots(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part for part in value.split(os.pathsep) if part.strip()]
        return value

    @field_validator("allowed_outbound_hosts", "allowed_s3_prefixes", "registry_groups", mode="before")
    @classmethod
    def _split_commas(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("registry_groups")
    @classmethod
    def _check_groups(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for entry in value:
            name, sep, members = str(entry).partition("=")
            if not sep or not re.fullmatch(r"[A-Za-z0-9._-]{1,100}", name.strip()) or not members.strip("+ "):
                raise ValueError(f"CAHP_REGISTRY_GROUPS entries must read group=keyid+keyid, got {entry!r}")
        return value

    def registry_owner(self, key_id: str) -> str:
        """Owner of the models ``key_id`` creates: ``group:<name>`` for a key in a group, else ``key:<id>``."""
        for entry in self.registry_groups:
            name, _, members = entry.partition("=")
            if key_id in {m.strip() for m in members.split("+")}:
                return f"group:{name.strip()}"
        return f"key:{key_id}"

    @field_validator("allowed_s3_prefixes")
    @classmethod
    def _check_s3_prefixes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        normal = []
        for entry in value:
            text = entry[len("s3://"):] if entry.startswith("s3://") else entry
            bucket, _, prefix = text.partition("/")
            if not _S3_BUCKET.fullmatch(bucket) or any(p in (".", "..") for p in prefix.split("/")):
                raise ValueError(
                    f"CAHP_ALLOWED_S3_PREFIXES entries must be bucket or bucket/prefix, got {entry!r}"
                )
            prefix = prefix.strip("/")
            normal.append(f"{bucket}/{prefix}" if prefix else bucket)
        return tuple(normal)

    @field_validator("data_dir", "hub_cache_dir", "work_dir")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        # Absolute at load time, so the API and the worker it starts agree on one place.
        return None if value is None else value.expanduser().absolute()

    @field_validator("allowed_local_roots")
    @classmethod
    def _resolve_roots(cls, value: tuple[Path, ...]) -> tuple[Path, ...]:
        return tuple(root.expanduser().resolve() for root in value)

    @field_validator("device")
    @classmethod
    def _check_device(cls, value: str) -> str:
        # The engine's own rule, so a worker never accepts a device its runs would refuse.
        try:
            return parse_device(value)
        except ConfigError as exc:
            raise ValueError(f"CAHP_DEVICE: {exc}") from exc

    @field_validator("artifact_store")
    @classmethod
    def _check_store(cls, value: str | None) -> str | None:
        if value is not None and value.startswith("s3://") and not value[len("s3://"):].strip("/"):
            raise ValueError("CAHP_ARTIFACT_STORE must name a bucket, like s3://bucket or s3://bucket/prefix")
        return value

    @model_validator(mode="after")
    def _check_visibility(self) -> Settings:
        timeout = self.broker_visibility_timeout_s
        if timeout is not None and timeout <= self.job_time_limit_s:
            raise ValueError(
                f"CAHP_BROKER_VISIBILITY_TIMEOUT_S ({timeout}) must exceed CAHP_JOB_TIME_LIMIT_S "
                f"({self.job_time_limit_s}); otherwise the broker hands a running job to a second worker"
            )
        if self.heartbeat_interval_s * 3 > self.lease_s:
            raise ValueError(
                f"CAHP_HEARTBEAT_INTERVAL_S ({self.heartbeat_interval_s}) must be at most a third of CAHP_LEASE_S "
                f"({self.lease_s}), so that one late heartbeat does not cost a healthy job its lease"
            )
        return self

    # --- values with defaults derived from the machine ---------------------------------------------

    @property
    def resolved_worker_memory_bytes(self) -> int:
        """``worker_memory_bytes``, else the memory of this machine (its cgroup's limit when lower)."""
        return self.worker_memory_bytes or machine_memory_bytes()

    @property
    def model_params_limit(self) -> int:
        """``max_model_params``, else what a worker's memory holds at :data:`BYTES_PER_PARAMETER` (at most 4e9)."""
        if self.max_model_params is not None:
            return self.max_model_params
        return max(1, min(self.resolved_worker_memory_bytes // BYTES_PER_PARAMETER, DEFAULT_MAX_MODEL_PARAMS))

    # --- values with defaults derived from data_dir ------------------------------------------------

    @property
    def embedded_broker(self) -> bool:
        """True when no broker is configured and the SQLite broker under ``data_dir`` is used."""
        return self.broker_url is None

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'cahp.db'}"

    @property
    def resolved_broker_url(self) -> str:
        return self.broker_url or f"sqla+sqlite:///{self.data_dir / 'broker.db'}"

    @property
    def resolved_artifact_store(self) -> str:
        return self.artifact_store or str(self.data_dir / "artifacts")

    @property
    def s3_store(self) -> bool:
        """True when artifacts (and ``s3://`` references) go through an S3-compatible store."""
        return self.resolved_artifact_store.startswith("s3://")

    @property
    def resolved_work_dir(self) -> Path:
        return self.work_dir or self.data_dir / "work"

    @property
    def visibility_timeout_s(self) -> int:
        return self.broker_visibility_timeout_s or self.job_time_limit_s + 3600

    @property
    def spool_dir(self) -> Path:
        """Where the API writes an upload while it arrives (partial files are swept after a crash)."""
        return self.data_dir / "spool"

    @property
    def takeover_bound_s(self) -> float:
        """Longest a job stays ``running`` after its worker died: the lease, plus one sweep."""
        return self.lease_s + self.sweep_interval_s

    def child_environment(self) -> dict[str, str]:
        """``CAHP_*`` variables that make another process (an embedded worker) see these settings."""
        env = {"CAHP_DATA_DIR": str(self.data_dir), "CAHP_DATABASE_URL": self.resolved_database_url,
               "CAHP_ARTIFACT_STORE": self.resolved_artifact_store, "CAHP_WORK_DIR": str(self.resolved_work_dir),
               "CAHP_BROKER_VISIBILITY_TIMEOUT_S": str(self.visibility_timeout_s),
               "CAHP_ALLOWED_LOCAL_ROOTS": os.pathsep.join(str(p) for p in self.allowed_local_roots)}
        env.update({f"CAHP_{name.upper()}": str(getattr(self, name)) for name in _CHILD_FIELDS})
        env.update({f"CAHP_{name.upper()}": ",".join(getattr(self, name)) for name in _CHILD_LISTS})
        if self.broker_url is not None:
            env["CAHP_BROKER_URL"] = self.broker_url
        for name in ("max_model_params", "worker_memory_bytes",
                     "s3_endpoint_url", "s3_region", "hub_cache_dir", "public_url", "s3_public_endpoint_url",
                     "mlflow_tracking_uri", "mlflow_tracking_username"):
            value = getattr(self, name)
            if value is not None:
                env[f"CAHP_{name.upper()}"] = str(value)
        for secret in ("hub_token", "signing_key", "mlflow_tracking_password", "mlflow_tracking_token"):
            value = getattr(self, secret)
            if value is not None:
                env[f"CAHP_{secret.upper()}"] = value.get_secret_value()
        return env


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read from the environment once."""
    return Settings()


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and addresses in 127.0.0.0/8 or ``::1``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
