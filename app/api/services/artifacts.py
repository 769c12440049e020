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
    *, session: Session, store: ArtifactStore, settings: Settings, job_id: str, name: str, expires: int,
    signature: str, range_header: str | None = None, if_range: str | None = None,
) -> tuple[Artifact, ByteRange | None, Iterator[bytes]]:
    """The artifact a signed link names, the range asked for and a stream of its bytes.

    The row is read first: a deleted job (or one whose artifacts expired) has no artifact to sign for,
    so its links stop working at once. Every refusal of a link says the same for a missing job and a
    wrong signature, so a link cannot be used to probe which jobs exist.

    Raises
    ------
    LinkInvalidError
        No such artifact, or a signature that does not match the job, name, bytes and expiry.
    LinkExpiredError
        A genuine link past its expiry.
    """
    job = repository.get_job(session, job_id=job_id)
    artifact = repository.get_artifact(session, job_id=job_id, name=name) if job is not None else None
    if job is None or artifact is None:
        raise LinkInvalidError("this link names no artifact this server keeps (the job may have been deleted); "
                               "ask for a new link with GET /v1/jobs/{id}/artifacts")
    check_local_link(settings, job_id=job_id, name=name, sha256=artifact.sha256, expires=expires,
                     signature=signature)
    if job.artifacts_expired:
        raise ArtifactsExpiredError(f"the artifacts of job {job_id} were deleted by the retention rule "
                                    "(CAHP_ARTIFACT_TTL_DAYS)")
    span = requested_range(range_header, size=artifact.size, etag=f'"{artifact.sha256}"', if_range=if_range)
    stream = (store.iter_bytes(artifact.storage_key) if span is None
              else store.iter_bytes(artifact.storage_key, span.start, span.end))
    session.commit()
    return artifact, span, stream
