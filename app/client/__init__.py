"""A small HTTP client of the job API, used by ``cahp submit/status/wait/download/upload``.

It survives what a deploy or a flaky network does to a long CI job. Every call is retried on a
connection error and on 429, 502, 503 and 504, with exponential back-off and jitter, waiting at
least what ``Retry-After`` asks (tenacity does the retrying), until ``timeout`` seconds have passed
since the call began. ``wait`` keeps going for as long as the job runs, and tolerates the server
being away for up to :data:`OUTAGE_S` at a time. A download resumes where it broke off (HTTP
``Range``, ``If-Range`` on the artifact's sha256) and is checked against the manifest's sha256.

Answers come back as frozen records (:class:`JobSnapshot`, :class:`ArtifactEntry`, :class:`UploadReceipt`,
:class:`ListPage`, :class:`LogEntry`); failures as one tree of :class:`ClientError` (drawn in
``_exceptions``). Imports httpx, tenacity, the standard library and :mod:`app.http_headers`, nothing
of the service or the engine: a CI loop calls ``cahp status`` often.

Modules: ``_client`` (:class:`ApiClient`), ``_records``, ``_exceptions``, ``_retries`` (when to try
again), ``_sse`` (the event stream), ``_transfers`` (downloads and uploads).
"""

from app.client._client import ApiClient
from app.client._exceptions import (
    AuthError,
    BadRequestError,
    ChecksumError,
    ClientError,
    InvalidResponseError,
    NotFoundError,
    ProblemError,
    RateLimitedError,
    ServerError,
    TransportError,
    WaitTimeoutError,
)
from app.client._records import (
    TERMINAL,
    ArtifactEntry,
    Attempt,
    CheckReport,
    DatasetRef,
    JobFailure,
    JobResult,
    JobSnapshot,
    ListPage,
    LogEntry,
    ModelRef,
    Registration,
    UploadReceipt,
)
from app.client._retries import OUTAGE_S, RETRY_STATUSES, backoff_s
from app.client._sse import ServerSentEvent, parse_sse

__all__ = [
    "OUTAGE_S",
    "RETRY_STATUSES",
    "TERMINAL",
    "ApiClient",
    "ArtifactEntry",
    "Attempt",
    "AuthError",
    "BadRequestError",
    "CheckReport",
    "ChecksumError",
    "ClientError",
    "DatasetRef",
    "InvalidResponseError",
    "JobFailure",
    "JobResult",
    "JobSnapshot",
    "ListPage",
    "LogEntry",
    "ModelRef",
    "NotFoundError",
    "ProblemError",
    "RateLimitedError",
    "Registration",
    "ServerError",
    "ServerSentEvent",
    "TransportError",
    "UploadReceipt",
    "WaitTimeoutError",
    "backoff_s",
    "parse_sse",
]
