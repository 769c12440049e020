"""Downloads through signed links: no API key, the link's signature and expiry instead
(:mod:`app.core.security._signing`)."""

from __future__ import annotations

from collections.abc import Iterator

from sqlalchemy.orm import Session

from app.api.ranges import ByteRange, requested_range
from app.core.db import Artifact, repository
from app.core.errors import ArtifactsExpiredError, LinkInvalidError
from app.core.security import check_local_link
from app.core.settings import Settings
from app.core.storage import ArtifactStore


def open_signed_artifact(
    *, session: Session, store: ArtifactStore, settings: Settings, owner_id: str, job_id: str, name: str,
    expires: int, signature: str, range_header: str | None = None, if_range: str | None = None,
) -> tuple[Artifact, ByteRange | None, Iterator[bytes]]:
    """The artifact a signed link names, the range asked for and a stream of its bytes.

    The signature and expiry are checked first, before any row is read, so the answer costs the same
    whether the job exists or not. Then the rows: a deleted job (or one whose artifacts expired) has no
    artifact to sign for, and a revoked key no job to share, so their links stop working at once. Every
    refusal says the same for a missing job, a revoked key and a wrong signature, so a link cannot be
    used to probe which jobs exist.

    Raises
    ------
    LinkInvalidError
        A signature that does not match the key, job, name and expiry; no such artifact; a revoked key.
    LinkExpiredError
        A genuine link past its expiry.
    """
    check_local_link(settings, owner_id=owner_id, job_id=job_id, name=name, expires=expires, signature=signature)
    job = repository.get_job(session, job_id=job_id)
    artifact = repository.get_artifact(session, job_id=job_id, name=name) if job is not None else None
    key = repository.get_api_key(session, key_id=owner_id)
    if job is None or artifact is None or job.owner_id != owner_id or key is None or key.revoked_at is not None:
        raise LinkInvalidError("this link names no artifact this server shares (the job may have been deleted, or "
                               "its API key revoked); ask for a new link with GET /v1/jobs/{id}/artifacts")
    if job.artifacts_expired:
        raise ArtifactsExpiredError(f"the artifacts of job {job_id} were deleted by the retention rule "
                                    "(CAHP_ARTIFACT_TTL_DAYS)")
    span = requested_range(range_header, size=artifact.size, etag=f'"{artifact.sha256}"', if_range=if_range)
    stream = (store.iter_bytes(artifact.storage_key) if span is None
              else store.iter_bytes(artifact.storage_key, span.start, span.end))
    session.commit()
    return artifact, span, stream
