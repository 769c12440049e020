"""What a finished job hands to the platform that takes its model: identity, links, a registered version.

After the artifacts are stored, :func:`event_details` gives the final event each one's time-limited
link (a receiver fetches the model without the submitter's key) and the run's identity and recipe, and
:func:`register` logs the run and registers the model in the operator's MLflow registry when the job
asked for it (:mod:`app.core.mlflow_registry`). What the engine is told about the job (its name, id,
labels, and what its inputs are called) is :meth:`worker.claims.JobDefinition.identity`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from app.core.db.repository import ArtifactRecord
from app.core.mlflow_registry import RegisterRequest, RegistrationOutcome, failed_registration, register_model
from app.core.security import ArtifactRef, artifact_link
from app.core.settings import Settings
from app.core.storage import ArtifactStore
from cahp_engine.run import RunReport


def event_details(settings: Settings, store: ArtifactStore, *, job_id: str, owner_id: str,
                  artifacts: Sequence[ArtifactRecord], report: RunReport | None) -> dict[str, Any]:
    """What the job's final event adds to its row: the artifacts' signed links, the run's identity and recipe,
    and a speed or FLOPs target's record (``report.json``'s ``target``: requested, predicted and measured
    speed-up, FLOPs kept, heads and neurons kept per layer) as fields a receiver reads without parsing text."""
    details: dict[str, Any] = {"artifacts": signed_links(settings, store, job_id=job_id, owner_id=owner_id,
                                                         artifacts=artifacts)}
    if report is not None:
        details["identity"] = report.identity.to_dict() if report.identity is not None else None
        details["recipe"] = report.recipe.to_dict() if report.recipe is not None else None
        details["target"] = report.target.to_dict() if report.target is not None else None
    return details


def signed_links(settings: Settings, store: ArtifactStore, *, job_id: str, owner_id: str,
                 artifacts: Sequence[ArtifactRecord]) -> list[dict[str, Any]]:
    """Each stored artifact with its time-limited link, as the webhook payload lists them.

    Links of the local store are absolute under ``CAHP_PUBLIC_URL`` when it is set, else relative to
    the API's address (the one the receiver was registered with).
    """
    out: list[dict[str, Any]] = []
    for a in artifacts:
        link = artifact_link(settings, store, job_id=job_id, owner_id=owner_id, base_url=settings.public_url,
                             artifact=ArtifactRef(name=a.name, sha256=a.sha256, storage_key=a.storage_key))
        out.append({"name": a.name, "size": a.size, "sha256": a.sha256, "media_type": a.media_type,
                    "signed_url": link.url if link else None,
                    "signed_url_expires_at": (link.expires_at.isoformat().replace("+00:00", "Z") if link else None)})
    return out


def register(settings: Settings, *, output: Path, job_id: str, owner_id: str, request: RegisterRequest,
             labels: Mapping[str, str], name: str | None) -> tuple[RegistrationOutcome, Exception | None]:
    """Register the job's model as ``request`` asks, for its key ``owner_id``; the outcome, and the error if it
    failed."""
    try:
        return register_model(settings, files=output, job_id=job_id, owner_id=owner_id, request=request,
                              labels=labels, name=name), None
    except Exception as exc:  # every failure is recorded on the job; the caller decides its code
        return failed_registration(settings, request, exc), exc
