"""What a job reads and how it is checked: references by URI scheme, archives, uploads' contents, preflight.

Reading order: ``sources`` (one module per URI scheme: ``check_reference`` at submit, ``fetch_reference``
in the worker) -> ``_archives`` (safe unpacking) -> ``_upload_contents`` (what an upload holds, indexed
when it arrives) -> ``_dataset_checks`` and ``_preflight`` (the model and dataset checked at submit, as the
worker would) -> ``_local`` (a job's references to local directories) -> ``_naming`` (what an input is
called)."""

from . import sources
from ._archives import ARCHIVE_SUFFIXES, archive_suffix, check_archive, storage_error, unpack
from ._local import InputFetcher, refuse_custom_code
from ._naming import reference_name
from ._preflight import PreflightReport, check_directories, check_inputs, preflight
from ._upload_contents import index_upload

__all__ = [
    "archive_suffix", "ARCHIVE_SUFFIXES", "check_archive", "check_directories", "check_inputs", "index_upload",
    "InputFetcher", "preflight", "PreflightReport", "reference_name", "refuse_custom_code", "sources",
    "storage_error", "unpack",
]
