"""The service's exceptions, in one hierarchy, each with a stable ``code`` and a title.

These are domain errors: they say what went wrong, not how HTTP answers it. The API maps each
class to a status (:data:`app.api.problems.STATUS_OF`, shown here for reference); the worker
records the ``code`` on a failed job.

::

    ServiceError                      every error the service raises on purpose
    ├── AuthenticationError       401 a missing, malformed or unknown API key
    ├── ForbiddenError            403 a request this server refuses whoever sends it
    │   ├── LinkInvalidError      403 a signed artifact link that was changed or not made here
    │   ├── LinkExpiredError      403 a signed artifact link past its expiry time
    │   └── RegisteredModelOwnedError 403 a registered model name that another key (or group) owns
    ├── ResourceNotFoundError     404 no such job, upload or artifact *for this key*
    ├── ConflictError             409 the request contradicts the resource's state
    │   ├── JobFinishedError      409 cancelling a job that already succeeded or failed
    │   ├── JobNotFinishedError   409 deleting a job that is still queued or running
    │   └── RegistrationLimitError 409 a job registered ``CAHP_MAX_REGISTRATIONS_PER_JOB`` times already
    ├── GoneError                 410 the resource existed and was removed on purpose
    │   └── ArtifactsExpiredError 410 the retention sweep removed the job's artifacts
    ├── PayloadTooLargeError      413 an upload over ``CAHP_MAX_UPLOAD_BYTES``
    ├── InvalidRequestError       422 input the caller must change
    │   ├── InvalidReferenceError 422 a model or dataset URI that cannot be used
    │   ├── InvalidUploadError    422 an upload of an unknown kind, or a bad archive
    │   ├── IdempotencyKeyReusedError 422 an ``Idempotency-Key`` sent again with another body
    │   ├── RegistryNotConfiguredError 422 ``register`` asked of a server without ``CAHP_MLFLOW_TRACKING_URI``
    │   ├── InspectionLimitError  422 inspecting what a key sent went past a limit of the inspection sandbox
    │   │   ├── InspectionMemoryLimitError, InspectionCpuLimitError, InspectionTimeLimitError,
    │   │   └── InspectionOutputLimitError, NestingTooDeepError   (one code per limit)
    │   ├── InspectionFailedError 422 a file the inspection could not read for a reason no check names
    │   ├── ModelTooLargeError    422 a model larger than a worker's memory holds (``CAHP_MAX_MODEL_PARAMS``)
    │   └── OutboundUrlRefusedError   422 an S3 or hub URL leading to a loopback, link-local or
    │                                     metadata address that ``CAHP_ALLOWED_OUTBOUND_HOSTS`` does not allow
    ├── QuotaExceededError        429 a key at one of its quotas (active jobs, event streams, stored uploads)
    ├── RangeNotSatisfiableError  416 a ``Range`` that starts past the end of the artifact
    ├── RegistryError             502 the MLflow tracking server refused or failed a registration
    ├── UnavailableError          503 the database or the broker cannot be reached
    └── InsufficientStorageError  507 the server's disk filled up while storing or unpacking

Engine errors (:mod:`cahp_engine.errors`) keep their own hierarchy; the problem handler in
:mod:`app.api.problems` maps ``InvalidInputError`` to 422 with the engine's code. The worker records the
``code`` of either hierarchy on a failed job, so one vocabulary of codes covers submit-time and
run-time failures.
"""

from __future__ import annotations


class ServiceError(Exception):
    """Base class of the service's deliberate errors."""

    code = "internal_error"
    title = "Internal error"


class AuthenticationError(ServiceError):
    code = "unauthenticated"
    title = "Authentication required"


class ForbiddenError(ServiceError):
    code = "forbidden"
    title = "Forbidden"


class LinkInvalidError(ForbiddenError):
    code = "link_invalid"
    title = "Invalid signed link"


class LinkExpiredError(ForbiddenError):
    code = "link_expired"
    title = "Signed link expired"


class RegisteredModelOwnedError(ForbiddenError):
    """A registered model name created by another key (or a group the key is not in)."""

    code = "registered_model_owned"
    title = "Registered model owned by another key"


class RegistryError(ServiceError):
    """The model registry (MLflow) failed a registration; a job ends with this code when its own did."""

    code = "registration_failed"
    title = "Model registration failed"


class ResourceNotFoundError(ServiceError):
    code = "not_found"
    title = "Not found"


class ConflictError(ServiceError):
    code = "conflict"
    title = "Conflict"


class JobFinishedError(ConflictError):
    code = "job_finished"
    title = "Job already finished"


class JobNotFinishedError(ConflictError):
    code = "job_not_finished"
    title = "Job not finished"


class RegistrationLimitError(ConflictError):
    code = "registration_limit_reached"
    title = "Registration limit reached"


class QuotaExceededError(ServiceError):
    """A key at one of its quotas; ``code`` names the quota, ``setting`` the variable that sets it.

    Answered 429 with ``Retry-After: retry_after_s``: the quota frees up as the key's jobs end, its
    streams close or its uploads are deleted.
    """

    code = "quota_exceeded"
    title = "Quota exceeded"

    def __init__(self, message: str, *, code: str, setting: str, limit: int, retry_after_s: int = 30) -> None:
        super().__init__(message)
        self.code = code
        self.setting = setting
        self.limit = limit
        self.retry_after_s = retry_after_s


class GoneError(ServiceError):
    code = "gone"
    title = "Gone"


class ArtifactsExpiredError(GoneError):
    code = "artifacts_expired"
    title = "Artifacts expired"


class RangeNotSatisfiableError(ServiceError):
    """A byte range outside the object; ``size`` goes into the answer's ``Content-Range: bytes */size``."""

    code = "range_not_satisfiable"
    title = "Range not satisfiable"

    def __init__(self, message: str, *, size: int) -> None:
        super().__init__(message)
        self.size = size


class PayloadTooLargeError(ServiceError):
    code = "payload_too_large"
    title = "Payload too large"


class InvalidRequestError(ServiceError, ValueError):
    code = "invalid_request"
    title = "Invalid request"


class InvalidReferenceError(InvalidRequestError):
    code = "invalid_reference"
    title = "Invalid model or dataset reference"


class InvalidUploadError(InvalidRequestError):
    code = "invalid_upload"
    title = "Invalid upload"


class IdempotencyKeyReusedError(InvalidRequestError):
    code = "idempotency_key_reused"
    title = "Idempotency key reused with a different request"


class UnavailableError(ServiceError):
    code = "service_unavailable"
    title = "Service unavailable"


class OutboundUrlRefusedError(InvalidRequestError):
    code = "outbound_url_refused"
    title = "Outbound address refused"


class InsufficientStorageError(ServiceError):
    """The server's disk (or quota) is full: the server's problem, not the caller's input."""

    code = "insufficient_storage"
    title = "Insufficient storage"


class RegistryNotConfiguredError(InvalidRequestError):
    """Not retryable by the caller: a job must drop ``register``, or the operator configure MLflow."""

    code = "registry_not_configured"
    title = "No model registry configured"


class InspectionLimitError(InvalidRequestError):
    """Inspecting uploaded or referenced content went past a limit of the inspection sandbox.

    Each subclass names one limit; the message says its value and the setting that changes it
    (:mod:`app.core.sandbox`).
    """

    code = "inspection_limit"
    title = "Inspection limit reached"


class InspectionMemoryLimitError(InspectionLimitError):
    code = "inspection_memory_limit"
    title = "Inspection memory limit reached"


class InspectionCpuLimitError(InspectionLimitError):
    code = "inspection_cpu_limit"
    title = "Inspection CPU limit reached"


class InspectionTimeLimitError(InspectionLimitError):
    code = "inspection_time_limit"
    title = "Inspection time limit reached"


class InspectionOutputLimitError(InspectionLimitError):
    code = "inspection_output_limit"
    title = "Inspection summary too large"


class NestingTooDeepError(InspectionLimitError):
    code = "nesting_too_deep"
    title = "Input nested too deeply"


class InspectionFailedError(InvalidRequestError):
    """Inspecting a file failed in a way no check of the service names (a parser's own error): never a 500."""

    code = "inspection_failed"
    title = "Input could not be inspected"


class ModelTooLargeError(InvalidRequestError):
    """A model whose job would need more memory than a worker has (or more parameters than the limit)."""

    code = "model_too_large"
    title = "Model too large for this service"

