"""Datasets read with the optional ``datasets`` package: ``save_to_disk`` directories and hub ids.

``datasets`` is imported when one of these is used, with a message saying how to install it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cahp_engine.data._options import DatasetOptions
from cahp_engine.data._table import Source, Table
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


def hub_source(
    ref: str, revision: str | None, cache_dir: str | None, token: str | None, config: str | None = None
) -> Source:
    """A hub dataset (from the hub, or the local cache when offline), in configuration ``config``."""
    datasets = _import_datasets(f"the hub dataset {ref!r}")
    _check_config(datasets, ref, config, revision=revision, cache_dir=cache_dir, token=token)
    try:
        loaded = datasets.load_dataset(ref, name=config, revision=revision, cache_dir=cache_dir, token=token)
    # load_dataset fails in many ways (ConnectionError offline, DatasetNotFoundError, FileNotFoundError,
    # HTTP errors); to the caller each means "cannot get it from here".
    except Exception as err:
        raise DatasetError(
            f"dataset {ref!r}{_named(config)} was not found on the Hugging Face hub or in the local cache, and "
            f"no local directory of that name exists ({type(err).__name__}: {str(err)[:300]}). Pass a local "
            "directory of {split}.csv/.jsonl/.parquet files or a save_to_disk directory instead"
        ) from err
    return _dict_source(datasets, loaded, f"hub dataset {ref!r}{_named(config)}")


def has_repository_layout(root: Path) -> bool:
    """Whether ``root`` is a script-free dataset repository: a ``README.md`` whose YAML lists ``configs``."""
    card = root / "README.md"
    if not card.is_file():
        return False
    head = card.read_text(encoding="utf-8", errors="replace")
    if not head.startswith("---"):
        return False
    front = head.split("---", 2)[1] if head.count("---") >= 2 else ""
    return any(line.startswith("configs:") for line in front.splitlines())


def repository_source(root: Path, config: str | None, *, cache_dir: str | None = None) -> Source:
    """A local copy of a hub dataset repository (``README.md`` ``configs`` and data files), read as the hub would."""
    datasets = _import_datasets(f"the dataset repository {str(root)!r}")
    _check_config(datasets, str(root), config)
    try:
        loaded = datasets.load_dataset(str(root), name=config, cache_dir=cache_dir)
    except Exception as err:
        raise DatasetError(
            f"{root}{_named(config)} cannot be read as a dataset repository ({type(err).__name__}: "
            f"{str(err)[:300]}); check the `configs` of its README.md"
        ) from err
    return _dict_source(datasets, loaded, f"{root}{_named(config)}")


def _check_config(datasets: Any, ref: str, config: str | None, **hub: Any) -> None:
    """Refuse a missing or unknown configuration with the list of the dataset's own, when it can be had."""
    try:
        names = list(datasets.get_dataset_config_names(ref, **{k: v for k, v in hub.items() if v is not None}))
    except Exception:  # offline with nothing cached, a gated dataset...: load_dataset reports it
        return
    if config is None and len(names) > 1:
        raise DatasetError(
            f"dataset {ref!r} has several configurations ({', '.join(names)}); name one with `config` "
            "(--dataset-config NAME)"
        )
    if config is not None and names and config not in names:
        raise DatasetError(
            f"dataset {ref!r} has no configuration {config!r}; its configurations are {', '.join(names)}"
        )


def _named(config: str | None) -> str:
    return f" (configuration {config!r})" if config else ""


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
