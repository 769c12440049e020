"""Datasets read with the optional ``datasets`` package: ``save_to_disk`` directories and hub ids.

``datasets`` is imported when one of these is used, with a message saying how to install it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cahp_engine.dataset_options import DatasetOptions
from cahp_engine.dataset_table import Source, Table
from cahp_engine.errors import DatasetError


def _import_datasets(what: str) -> Any:
    try:
        import datasets
    except ImportError:
        raise DatasetError(
            f"reading {what} needs the optional `datasets` package; install it with `pip install cahp[hub]`, "
            "or pass a directory of .csv/.jsonl/.parquet split files"
        ) from None
    return datasets


def disk_source(root: Path) -> Source:
    datasets = _import_datasets("a save_to_disk directory")
    try:
        loaded = datasets.load_from_disk(str(root))
    except (OSError, ValueError, KeyError) as err:
        raise DatasetError(f"{root} cannot be read with datasets.load_from_disk ({err}); save it again") from None
    return _dict_source(datasets, loaded, f"{root}")


def hub_source(ref: str, revision: str | None, cache_dir: str | None, token: str | None) -> Source:
    datasets = _import_datasets(f"the hub dataset {ref!r}")
    try:
        loaded = datasets.load_dataset(ref, revision=revision, cache_dir=cache_dir, token=token)
    # load_dataset fails in many ways (ConnectionError offline, DatasetNotFoundError, FileNotFoundError,
    # ValueError for a missing config, HTTP errors); to the caller each means "cannot get it from here".
    except Exception as err:
        raise DatasetError(
            f"dataset {ref!r} was not found on the Hugging Face hub or in the local cache, and no local "
            f"directory of that name exists ({type(err).__name__}: {str(err)[:300]}). Pass a local "
            "directory of {split}.csv/.jsonl/.parquet files or a save_to_disk directory instead"
        ) from err
    return _dict_source(datasets, loaded, f"hub dataset {ref!r}")


def _dict_source(datasets: Any, loaded: Any, where: str) -> Source:
    if not isinstance(loaded, datasets.DatasetDict):
        raise DatasetError(
            f"{where} holds a single {type(loaded).__name__}, not a DatasetDict of splits; save a "
            "DatasetDict({'train': ..., 'test': ...}) instead"
        )

    def read(split: str, options: DatasetOptions) -> Table:
        part = loaded[split]
        names = tuple(part.column_names)
        values = {name: list(part[name]) for name in options.columns if name in names}
        feature = part.features.get(options.label_column)
        declared = tuple(feature.names) if isinstance(feature, datasets.ClassLabel) else None
        return Table(f"split {split!r} of {where}", names, values, part.num_rows, None, declared)

    return Source(splits=tuple(loaded), read=read)
