"""What to call a job's model and dataset before a worker has read them: names from their references.

A list of jobs that reads ``upload://02956c...`` says nothing; the name the submitter's files had
does. :func:`reference_name` gives the hub id of an ``hf://`` reference, the name of an uploaded
archive or file (``my-model.tar.gz`` -> ``my-model``), or the last part of a ``file://`` path or an
``s3://`` key. The worker passes these to the engine, whose report prefers what the model itself
says (its hub id, its checkpoint's ``_name_or_path``) when it says something.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from sqlalchemy.orm import Session

from app.core.db import repository
from app.core.inputs.sources import Reference

#: Archive suffixes taken off a name, longest first.
_ARCHIVE_SUFFIXES = (".tar.gz", ".tar.bz2", ".tar.xz", ".tgz", ".tar", ".zip")


def strip_archive_suffix(filename: str) -> str:
    lowered = filename.lower()
    for suffix in _ARCHIVE_SUFFIXES:
        if lowered.endswith(suffix) and len(filename) > len(suffix):
            return filename[: -len(suffix)]
    return filename


def reference_name(reference: Reference, *, session: Session | None = None, owner_id: str | None = None) -> str:
    """A short human name for a parsed reference (see the module's description); at most 255 characters."""
    if reference.scheme == "hf":
        name = reference.target.removeprefix("datasets/")
    elif reference.scheme == "upload" and session is not None and owner_id is not None:
        upload = repository.get_upload(session, upload_id=reference.target, owner_id=owner_id)
        name = strip_archive_suffix(PurePosixPath(upload.filename).name) if upload is not None else reference.target
    else:
        name = strip_archive_suffix(PurePosixPath(reference.target.rstrip("/")).name) or reference.target
    return name[:255]
