"""Artifact rows: what a finished job stored, and where."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.models import Artifact


@dataclass(frozen=True)
class ArtifactRecord:
    name: str
    size: int
    sha256: str
    media_type: str
    storage_key: str


def list_artifacts(session: Session, *, job_id: str) -> list[Artifact]:
    return list(session.scalars(select(Artifact).where(Artifact.job_id == job_id).order_by(Artifact.name)))


def get_artifact(session: Session, *, job_id: str, name: str) -> Artifact | None:
    return session.scalar(select(Artifact).where(Artifact.job_id == job_id, Artifact.name == name))
