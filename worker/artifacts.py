"""Packing a finished run's output directory into stored artifacts with their sha256.

Each directory the engine wrote becomes one archive: ``model/`` is ``model.tar.gz`` (unpacks to
``model/``), ``onnx/`` is ``onnx.tar.gz`` and ``onnx-int8/`` is ``onnx-int8.tar.gz``; the other files
are stored as they are. Objects go under
``jobs/<job id>/<attempt>/`` so a second attempt at a job never overwrites the first one's files;
the caller records the rows only after every object is stored.
"""

from __future__ import annotations

import hashlib
import logging
import tarfile
from collections.abc import Callable, Iterable
from pathlib import Path

from app.core.db.repository import ArtifactRecord
from app.core.storage import ARTIFACT_MEDIA_TYPES as MEDIA_TYPES
from app.core.storage import ArtifactStore, job_prefix
from worker.redaction import redact_json_file

MODEL_ARCHIVE = "model.tar.gz"
logger = logging.getLogger(__name__)


def media_type(name: str) -> str:
    return MEDIA_TYPES.get(Path(name).suffix.lower(), "application/octet-stream")


def pack_directory(directory: Path, archive: Path) -> Path:
    """Write ``directory`` as a gzipped tar whose single top-level entry is the directory's name."""
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(directory, arcname=directory.name)
    return archive


def store_artifacts(
    output_dir: Path, names: Iterable[str], *, store: ArtifactStore, job_id: str, attempt: int,
    redact: Callable[[str], str] | None = None,
) -> list[ArtifactRecord]:
    """Store each directory of ``output_dir`` as ``<name>.tar.gz`` (``model/`` first) and each named file.

    With ``redact`` (the job's :class:`worker.redaction.Redactor`), every string of each JSON file
    (``report.json``, ``mss_curve.json``, ``head_map.json``) passes through it first, as the job's log
    lines do: callers read those files.
    """
    files: list[tuple[str, Path]] = []
    directories = sorted((p for p in output_dir.iterdir() if p.is_dir()), key=lambda p: (p.name != "model", p.name))
    for directory in directories:
        # Packed beside output_dir, not in it, so the engine's own files are listed unchanged.
        name = f"{directory.name}.tar.gz"
        files.append((name, pack_directory(directory, output_dir.with_name(name))))
    files.extend((name, output_dir / name) for name in names if (output_dir / name).is_file())
    if redact is not None:
        for name, path in files:
            if media_type(name) == "application/json":
                redact_json_file(path, redact)
    records: list[ArtifactRecord] = []
    try:
        for name, path in files:
            key = f"{job_prefix(job_id)}/{attempt}/{name}"
            kind = media_type(name)
            store.put_file(key, path, media_type=kind)
            with open(path, "rb") as handle:
                sha256 = hashlib.file_digest(handle, "sha256").hexdigest()
            records.append(ArtifactRecord(name=name, size=path.stat().st_size, sha256=sha256,
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
