"""Packing a finished run's output directory into stored artifacts with their sha256.

The pruned checkpoint directory ``model/`` becomes ``model.tar.gz`` (one download, unpacks to
``model/``); the other files the engine wrote are stored as they are. Objects go under
``jobs/<job id>/<attempt>/`` so a second attempt at a job never overwrites the first one's files;
the caller records the rows only after every object is stored.
"""

from __future__ import annotations

import hashlib
import logging
import tarfile
from collections.abc import Iterable
from pathlib import Path

from app.core.repository import ArtifactRecord
from app.core.storage import ARTIFACT_MEDIA_TYPES as MEDIA_TYPES
from app.core.storage import ArtifactStore, job_prefix

MODEL_ARCHIVE = "model.tar.gz"
logger = logging.getLogger(__name__)


def media_type(name: str) -> str:
    return MEDIA_TYPES.get(Path(name).suffix.lower(), "application/octet-stream")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1024 * 1024):
            digest.update(chunk)
    return digest.hexdigest()


def pack_model(model_dir: Path, archive: Path) -> Path:
    """Write ``model_dir`` as a gzipped tar whose single top-level entry is ``model/``."""
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(model_dir, arcname="model")
    return archive


def store_artifacts(
    output_dir: Path, names: Iterable[str], *, store: ArtifactStore, job_id: str, attempt: int
) -> list[ArtifactRecord]:
    """Store ``model.tar.gz`` (from ``output_dir/model``) and each named file that exists."""
    files: list[tuple[str, Path]] = []
    if (output_dir / "model").is_dir():
        # Packed beside output_dir, not in it, so the engine's own files are listed unchanged.
        files.append((MODEL_ARCHIVE, pack_model(output_dir / "model", output_dir.with_name(MODEL_ARCHIVE))))
    files.extend((name, output_dir / name) for name in names if (output_dir / name).is_file())
    records: list[ArtifactRecord] = []
    try:
        for name, path in files:
            key = f"{job_prefix(job_id)}/{attempt}/{name}"
            kind = media_type(name)
            store.put_file(key, path, media_type=kind)
            records.append(ArtifactRecord(name=name, size=path.stat().st_size, sha256=sha256_of(path),
                                          media_type=kind, storage_key=key))
    except BaseException:
        # A full disk (or a store that fails half-way) must not leave objects that no row points at.
        for record in records:
            try:
                store.delete(record.storage_key)
            except Exception as exc:
                logger.warning("could not remove %s after a failed store: %s", record.storage_key, exc)
        raise
    return records
