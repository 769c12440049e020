"""What a job reads and how it is checked: references by URI scheme, archives, uploads' contents, preflight.

Reading order: ``sources`` (one module per URI scheme: ``check_reference`` at submit, ``fetch_reference``
in the worker) -> ``_archives`` (safe unpacking) -> ``_upload_contents`` (what an upload holds, indexed
when it arrives) -> ``_dataset_checks`` and ``_preflight`` (the model and dataset checked at submit, as the
worker would) -> ``_local`` (a job's references to local directories) -> ``_naming`` (what an input is
called)."""

from . import sources
from ._archives import ARCHIVE_SUFFIXES, archive_suffix, check_archive, read_root_files, storage_error, unpack
from ._dataset_checks import (
    MAX_CARD_BYTES,
    check_card_bytes,
    check_dataset_archive,
    check_dataset_directory,
    ranged_file,
)
from ._local import CODE_CONFIGS, DEFAULT_EVAL_SPLIT, InputFetcher, Inputs, refuse_code_configs, refuse_custom_code
from ._naming import reference_name, strip_archive_suffix
from ._preflight import PreflightReport, preflight
from ._upload_contents import (
    CONTENTS_VERSION,
    MAX_NAMES,
    MAX_SMALL_FILE,
    SMALL_FILES,
    SPLIT_PLACEHOLDER,
    index_archive,
    index_upload,
    relabel,
)

__all__ = [
    "archive_suffix", "ARCHIVE_SUFFIXES", "check_archive", "check_card_bytes", "check_dataset_archive",
    "check_dataset_directory", "CODE_CONFIGS", "CONTENTS_VERSION", "DEFAULT_EVAL_SPLIT", "index_archive",
    "index_upload", "InputFetcher", "Inputs", "MAX_CARD_BYTES", "MAX_NAMES", "MAX_SMALL_FILE", "preflight",
    "PreflightReport", "ranged_file", "read_root_files", "reference_name", "refuse_code_configs",
    "refuse_custom_code", "relabel", "SMALL_FILES", "sources", "SPLIT_PLACEHOLDER", "storage_error",
    "strip_archive_suffix", "unpack",
]
