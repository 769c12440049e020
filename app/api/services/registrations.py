"""Registering a finished job's model in the MLflow registry on request (``POST /v1/jobs/{id}/register``).

The job's stored artifacts are read back (the directories unpacked), registered with
:func:`app.core.mlflow_registry.register_model`, and the outcome recorded on the job. A job may be
registered again: each call adds a new version. A job whose own registration failed
(``registration_failed``) keeps its artifacts, so this is how its registration is retried.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from sqlalchemy.orm import Session

from app.api.schemas import RegisterSpec, RegistrationPublic
from app.api.services.jobs import get_job
from app.core.db import JobStatus, repository
from app.core.errors import (
    ArtifactsExpiredError,
    InvalidRequestError,
    JobNotFinishedError,
    RegistrationLimitError,
    RegistryError,
)
from app.core.inputs import unpack
from app.core.mlflow_registry import (
    RegisterRequest,
    check_registry,
    failed_registration,
    public_registration,
    register_model,
)
from app.core.settings import Settings
from app.core.storage import ArtifactStore

#: The failure that keeps a complete model: the job's own registration failed.
_REGISTRABLE_FAILURES = ("registration_failed",)
#: What a registration reads back: the report and the checkpoint at least.
_NEEDED = ("report.json", "model.tar.gz")


def register_job(*, session: Session, store: ArtifactStore, settings: Settings, owner_id: str, job_id: str,
                 spec: RegisterSpec | None) -> RegistrationPublic:
    """Register job ``job_id``'s model as ``spec`` says (default: the ``register`` the job was submitted with).

    Raises
    ------
    ResourceNotFoundError, ArtifactsExpiredError
        No such job for this key; or its artifacts are gone.
    JobNotFinishedError, InvalidRequestError
        The job has no model to register (not succeeded), or no model name was given.
    RegistrationLimitError
        The job was registered ``CAHP_MAX_REGISTRATIONS_PER_JOB`` times already.
    RegisteredModelOwnedError
        The name belongs to another key (or group).
    RegistryNotConfiguredError, OutboundUrlRefusedError, RegistryError
        The server has no registry, may not reach it, or the registry failed.
    """
    # Another key's job is a 404 whatever the server's registry, as on every route of a job.
    job = get_job(session=session, owner_id=owner_id, job_id=job_id)
    check_registry(settings)
    if job.artifacts_expired:
        raise ArtifactsExpiredError(f"the artifacts of job {job_id} were deleted by the retention rule "
                                    "(CAHP_ARTIFACT_TTL_DAYS); there is no model left to register")
    registrable = job.status == JobStatus.succeeded.value or (
        job.status == JobStatus.failed.value and job.error_code in _REGISTRABLE_FAILURES)
    if not registrable:
        raise JobNotFinishedError(f"job {job_id} is {job.status}"
                                  + (f" ({job.error_code})" if job.error_code else "")
                                  + "; only a succeeded job has a model to register")
    chosen = spec.model_dump(mode="json") if spec is not None else job.register
    if not chosen:
        raise InvalidRequestError("name the registered model: send {\"model_name\": ...} (the job was submitted "
                                  "without `register`)")
    request = RegisterRequest.from_dict(chosen)
    artifacts = repository.list_artifacts(session, job_id=job_id)
    missing = [name for name in _NEEDED if name not in {a.name for a in artifacts}]
    if missing:
        raise JobNotFinishedError(f"job {job_id} kept no {' and no '.join(missing)}: there is no model to register")
    name, labels = job.name, dict(job.labels or {})
    if not repository.reserve_registration(session, job_id=job_id, limit=settings.max_registrations_per_job):
        raise RegistrationLimitError(
            f"job {job_id} was registered {settings.max_registrations_per_job} times already, the most one job may "
            f"be (CAHP_MAX_REGISTRATIONS_PER_JOB={settings.max_registrations_per_job}); submit the job again for "
            "more versions")
    # The download and the registry's upload take a while: no transaction stays open meanwhile.
    session.commit()
    with tempfile.TemporaryDirectory(prefix=f"cahp-register-{job_id}-") as scratch:
        files = Path(scratch) / "files"
        files.mkdir()
        for artifact in artifacts:
            target = Path(scratch) / artifact.name
            store.download(artifact.storage_key, target)
            if artifact.name.endswith(".tar.gz"):
                root = unpack(target, Path(scratch) / f"unpacked-{artifact.name}",
                              max_bytes=settings.max_unpacked_bytes, max_members=settings.max_archive_members)
                root.rename(files / artifact.name.removesuffix(".tar.gz"))
            else:
                target.rename(files / artifact.name)
        try:
            outcome = register_model(settings, files=files, job_id=job_id, owner_id=owner_id, request=request,
                                     labels=labels, name=name, work=Path(scratch) / "registry")
        except RegistryError as exc:
            repository.set_registration(session, job_id=job_id, registration=failed_registration(
                settings, request, exc).to_dict())
            session.commit()
            raise
    repository.set_registration(session, job_id=job_id, registration=outcome.to_dict())
    session.commit()
    return RegistrationPublic.model_validate(public_registration(outcome.to_dict()))
