"""What an inspection child may be asked to do; each task takes picklable arguments and returns plain data.

These run only in a child of :class:`app.core.sandbox.InspectionPool`, under its limits: they read
the files a key holder sent or named.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.core.inputs.sources import SourceContext, UploadInfo
from app.core.settings import Settings


def index_upload(*, local: str, kind: str, suffix: str, shown: str, settings: Settings) -> dict[str, Any] | None:
    """Check an arrived upload (an archive member by member) and return its contents record.

    Raises
    ------
    InvalidUploadError
        For an unsafe or corrupt archive (:func:`app.core.inputs.check_archive`).
    """
    from app.core.inputs import check_archive
    from app.core.inputs import index_upload as index

    path = Path(local)
    if kind == "archive":
        check_archive(path, max_bytes=settings.max_unpacked_bytes, max_members=settings.max_archive_members,
                      shown=shown)
    return index(path, kind=kind, suffix=suffix, max_rows=settings.max_dataset_rows)


def check_inputs(*, settings: Settings, owner_id: str, model: dict[str, Any], dataset: dict[str, Any],
                 uploads: dict[str, dict[str, Any] | None]) -> dict[str, list[str]]:
    """The submit-time checks of a job's model and dataset (:func:`app.core.inputs.check_inputs`).

    ``uploads`` maps each upload id the job names to its row's values (:class:`UploadInfo` as a
    mapping), or None where the key has no such upload.
    """
    from app.core.inputs import check_inputs as check

    rows = {upload_id: UploadInfo(**row) if row is not None else None for upload_id, row in uploads.items()}
    context = SourceContext(settings=settings, owner_id=owner_id, find_upload=lambda upload_id: rows.get(upload_id))
    report = check(model=model, dataset=dataset, context=context)
    return {"checked": list(report.checked), "skipped": list(report.skipped)}


def check_fetched(*, model: str, dataset: str, dataset_record: dict[str, Any], settings: Settings
                  ) -> dict[str, list[str]]:
    """A worker's check of the inputs it fetched (local directories; a hub id is left to the engine)."""
    from app.core.inputs import check_directories
    from app.core.params import dataset_options

    report = check_directories(model=Path(model) if Path(model).is_dir() else None,
                               dataset=Path(dataset) if Path(dataset).is_dir() else None,
                               options=dataset_options(dataset_record), settings=settings)
    return {"checked": list(report.checked), "skipped": list(report.skipped)}


TASKS: dict[str, Callable[..., Any]] = {"index_upload": index_upload, "check_inputs": check_inputs,
                                        "check_fetched": check_fetched}
