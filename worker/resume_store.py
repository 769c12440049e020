"""A job's resume state in the artifact store: what the engine saved, for the next attempt on any worker.

:class:`ArtifactResumeStore` is the engine's :class:`~cahp_engine.run.ResumeStore` over the
artifact store, under ``jobs/<id>/checkpoints/`` (the folder keeps its old name so that a job saved by an earlier
release is still found): every stage's files under a prefix of their own,
and ``index.json`` naming the prefix that holds each stage now. A save uploads the files, then
replaces the index (the one write that makes them current), then deletes the stage's previous files,
so a worker killed at any moment leaves an index that names complete stages. ``restore`` downloads
what the index names into the attempt's scratch directory. The resume state is removed when the job
ends (:func:`worker.runner.execute_job`), with the job (``DELETE``), or by the sweeper for a job it
ends.
"""

from __future__ import annotations

import json
import logging
import shutil
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

from app.core.errors import ResourceNotFoundError
from app.core.storage import ArtifactStore, resume_prefix

logger = logging.getLogger(__name__)


class ArtifactResumeStore:
    """The resume state of job ``job_id`` in ``store``; restored into ``local`` (the attempt's scratch space)."""

    def __init__(self, store: ArtifactStore, *, job_id: str, local: Path,
                 on_restore: Callable[[Mapping[str, Path]], None] | None = None) -> None:
        self._store = store
        # Told what a restore found (the attempt's history records where it went on from).
        self._on_restore = on_restore
        self._prefix = resume_prefix(job_id)
        self._local = local

    @property
    def _index_key(self) -> str:
        return f"{self._prefix}/index.json"

    def _index(self) -> dict[str, dict[str, object]]:
        target = self._local / ".index.json"
        self._local.mkdir(parents=True, exist_ok=True)
        try:
            self._store.download(self._index_key, target)
            index = json.loads(target.read_text(encoding="utf-8"))
        except (ResourceNotFoundError, FileNotFoundError):
            return {}
        except ValueError:
            logger.warning("checkpoint index %s is unreadable; starting over", self._index_key)
            return {}
        return index if isinstance(index, dict) else {}

    def save(self, stage: str, directory: Path) -> None:
        prefix = f"{self._prefix}/{stage}-{uuid.uuid4().hex[:12]}"
        files = sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file())
        for name in files:
            self._store.put_file(f"{prefix}/{name}", directory / name, media_type="application/octet-stream")
        index = self._index()
        previous = index.get(stage, {}).get("prefix")
        index[stage] = {"prefix": prefix, "files": files}
        written = self._local / ".index.new.json"
        written.write_text(json.dumps(index), encoding="utf-8")
        self._store.put_file(self._index_key, written, media_type="application/json")
        if isinstance(previous, str) and previous != prefix:
            try:
                self._store.delete_prefix(previous)
            except Exception as exc:  # left behind, removed with the job's resume state at its end
                logger.warning("could not delete the replaced checkpoint %s: %s", previous, exc)

    def restore(self) -> Mapping[str, Path]:
        restored: dict[str, Path] = {}
        for stage, entry in self._index().items():
            target = self._local / stage
            shutil.rmtree(target, ignore_errors=True)
            names = entry.get("files") if isinstance(entry, dict) else None
            try:
                for name in names if isinstance(names, list) else ():
                    (target / str(name)).parent.mkdir(parents=True, exist_ok=True)
                    self._store.download(f"{entry['prefix']}/{name}", target / str(name))
            except (ResourceNotFoundError, FileNotFoundError, KeyError) as exc:
                logger.warning("checkpoint %s of %s is incomplete (%s); that stage runs again", stage,
                               self._prefix, exc)
                shutil.rmtree(target, ignore_errors=True)
                continue
            restored[stage] = target
        if self._on_restore is not None and restored:
            self._on_restore(restored)
        return restored

    def discard(self, stage: str) -> None:
        index = self._index()
        entry = index.pop(stage, None)
        if entry is None:
            return
        written = self._local / ".index.new.json"
        written.write_text(json.dumps(index), encoding="utf-8")
        self._store.put_file(self._index_key, written, media_type="application/json")
        prefix = entry.get("prefix") if isinstance(entry, dict) else None
        if isinstance(prefix, str):
            try:
                self._store.delete_prefix(prefix)
            except Exception as exc:  # removed with the job's resume state at its end
                logger.warning("could not delete the discarded checkpoint %s: %s", prefix, exc)

    def remove(self) -> None:
        """Delete the job's whole resume state (at its end)."""
        self._store.delete_prefix(self._prefix)
