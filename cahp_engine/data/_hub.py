"""Datasets read with the optional ``datasets`` package: ``save_to_disk`` directories, repository
directories and hub ids.

``datasets`` is imported when one of these is used, with a message saying how to install it. A local
directory is checked before ``datasets`` sees it (:mod:`cahp_engine.data._paths`,
:mod:`cahp_engine.data._card`), since its JSON and YAML files name the files ``datasets`` opens;
every split's row count is checked against the limit before its rows become Python objects.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from cahp_engine.data._card import CARD_FILES, check_card_text, check_repository, has_card_configs
from cahp_engine.data._files import parquet_rows
from cahp_engine.data._options import DatasetOptions
from cahp_engine.data._paths import check_saved_dataset
from cahp_engine.data._table import Source, Table, check_rows
from cahp_engine.errors import DatasetError

#: Data files read from a repository directory: the tabular formats a classifier's splits come in.
#: Compressed or archived files (which could unpack to far more than they hold) and the formats of
#: other builders (images, audio, HDF5, ...) are refused.
REPOSITORY_SUFFIXES: tuple[str, ...] = (".csv", ".tsv", ".json", ".jsonl", ".ndjson", ".parquet")


def _import_datasets(what: str) -> Any:
    try:
        import datasets
    except ImportError:
        raise DatasetError(
            f"reading {what} needs the optional `datasets` package; install it with `pip install cahp[hub]`, "
            "or pass a directory of .csv/.jsonl/.parquet split files"
        ) from None
    return datasets


def disk_source(root: Path, max_rows: int | None = None) -> Source:
    """A ``save_to_disk`` directory, once its JSON files are known to name only its own files."""
    datasets = _import_datasets("a save_to_disk directory")
    check_saved_dataset(root)
    try:
        loaded = datasets.load_from_disk(str(root))
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise DatasetError(f"{root} cannot be read with datasets.load_from_disk ({err}); save it again") from None
    return _dict_source(datasets, loaded, f"{root}", max_rows)


def hub_source(
    ref: str, revision: str | None, cache_dir: str | None, token: str | None, config: str | None = None,
    max_rows: int | None = None,
) -> Source:
    """A hub dataset (from the hub, or the local cache when offline), in configuration ``config``."""
    datasets = _import_datasets(f"the hub dataset {ref!r}")
    # The repository's cards name the files datasets opens; a hostile card could name files on this
    # machine (absolute paths, globs, other URLs). Checked before datasets resolves a pattern, and the
    # files it resolved are checked again before any is read.
    revision = _check_hub_cards(ref, revision=revision, token=token)
    _check_config(datasets, ref, config, revision=revision, cache_dir=cache_dir, token=token)
    try:
        builder = datasets.load_dataset_builder(ref, name=config, revision=revision, cache_dir=cache_dir,
                                                token=token)
        check_hub_data_files(ref, builder.config.data_files)
        builder.download_and_prepare()
        loaded = builder.as_dataset()
    except DatasetError:
        raise
    # load_dataset fails in many ways (ConnectionError offline, DatasetNotFoundError, FileNotFoundError,
    # HTTP errors); to the caller each means "cannot get it from here".
    except Exception as err:
        raise DatasetError(
            f"dataset {ref!r}{_named(config)} was not found on the Hugging Face hub or in the local cache, and "
            f"no local directory of that name exists ({type(err).__name__}: {str(err)[:300]}). Pass a local "
            "directory of {split}.csv/.jsonl/.parquet files or a save_to_disk directory instead"
        ) from err
    return _dict_source(datasets, loaded, f"hub dataset {ref!r}{_named(config)}", max_rows)


def _check_hub_cards(ref: str, *, revision: str | None, token: str | None) -> str | None:
    """Read the hub repository's ``README.md`` and ``.huggingface.yaml`` and check their ``configs``.

    Returns the commit the checked cards were read at, so that ``datasets`` reads the same one (the
    repository could change between the check and the read); ``revision`` itself when no card could
    be fetched (offline with nothing cached, no such file), which leaves the dataset to
    ``load_dataset``'s own reporting, and :func:`check_hub_data_files` still checks what it resolves.
    """
    from huggingface_hub import hf_hub_download

    pinned = revision
    for name in CARD_FILES:
        try:
            path = Path(hf_hub_download(ref, name, repo_type="dataset", revision=pinned, token=token))
        except Exception:  # offline, not found, gated: nothing to read here
            continue
        if path.parent.parent.name == "snapshots":  # <cache>/datasets--org--name/snapshots/<commit>/<file>
            pinned = path.parent.name
        text = path.read_text(encoding="utf-8", errors="replace")
        check_card_text(name, text, where=f"hub dataset {ref!r} ({name})")
    return pinned


def check_hub_data_files(ref: str, data_files: Any) -> None:
    """Every file a hub dataset's patterns resolved to lies inside that hub repository.

    The resolved names are not repeated in the message: a pattern that reached this machine's files
    would otherwise tell the caller which of them exist.

    Raises
    ------
    DatasetError
        For a resolved file that is a local path or a URL outside ``hf://datasets/<ref>``.
    """
    inside = f"hf://datasets/{ref}@"
    for split, paths in (data_files or {}).items():
        for path in paths:
            text = str(path)
            rest = text[len(inside):].partition("/")[2] if text.startswith(inside) else ""
            if not rest or ".." in rest.split("/"):
                raise DatasetError(
                    f"hub dataset {ref!r}: split {split!r} names a data file outside the repository (a local "
                    "path or another URL); a hub dataset may name its own files only, relative to its root"
                )


def has_repository_layout(root: Path) -> bool:
    """Whether ``root`` is a script-free dataset repository: its ``README.md`` YAML (or ``.huggingface.yaml``)
    lists ``configs``."""
    return has_card_configs(root)


def repository_source(
    root: Path, config: str | None, *, cache_dir: str | None = None, max_rows: int | None = None
) -> Source:
    """A local copy of a hub dataset repository (``README.md`` ``configs`` and data files), read as the hub would.

    The cards are checked before ``datasets`` reads them, and the files their patterns resolve to
    are checked again before any is read: each must be a regular file inside ``root`` in one of
    :data:`REPOSITORY_SUFFIXES`, and Parquet files may not declare more than ``max_rows`` rows a split.
    """
    datasets = _import_datasets(f"the dataset repository {str(root)!r}")
    check_repository(root)
    _check_config(datasets, str(root), config)
    try:
        builder = datasets.load_dataset_builder(str(root), name=config, cache_dir=cache_dir)
    except Exception as err:
        raise _unreadable(root, config, err) from err
    _check_data_files(root, builder.config.data_files or {}, max_rows)
    try:
        builder.download_and_prepare()
        loaded = builder.as_dataset()
    except Exception as err:
        raise _unreadable(root, config, err) from err
    return _dict_source(datasets, loaded, f"{root}{_named(config)}", max_rows)


def _unreadable(root: Path, config: str | None, err: Exception) -> DatasetError:
    return DatasetError(
        f"{root}{_named(config)} cannot be read as a dataset repository ({type(err).__name__}: "
        f"{str(err)[:300]}); check the `configs` of its README.md"
    )


def _check_data_files(root: Path, data_files: Any, max_rows: int | None) -> None:
    """Each file the patterns resolved to is a regular file inside ``root`` of a readable kind."""
    real_root = Path(os.path.realpath(root))
    for split, paths in data_files.items():
        declared = 0
        for path in paths:
            text = str(path)
            local = Path(text)
            real = Path(os.path.realpath(local)) if local.is_absolute() and "://" not in text else None
            if real is None or not real.is_relative_to(real_root) or not real.is_file():
                raise DatasetError(
                    f"{root}: split {split!r} would read a file that is not inside the dataset directory; name "
                    "data files relative to the directory, and copy linked files into it"
                )
            if not real.name.lower().endswith(REPOSITORY_SUFFIXES):
                raise DatasetError(
                    f"{root}: split {split!r} has the data file {real.relative_to(real_root).as_posix()!r}; cahp "
                    f"reads {', '.join(REPOSITORY_SUFFIXES)} files from a dataset directory (unpack compressed or "
                    "archived files first)"
                )
            if real.name.lower().endswith(".parquet"):
                declared += parquet_rows(real)
        check_rows(str(split), str(root), declared, max_rows, declared=True)


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


def _dict_source(datasets: Any, loaded: Any, where: str, max_rows: int | None = None) -> Source:
    if not isinstance(loaded, datasets.DatasetDict):
        raise DatasetError(
            f"{where} holds a single {type(loaded).__name__}, not a DatasetDict of splits; save a "
            "DatasetDict({'train': ..., 'test': ...}) instead"
        )

    def read(split: str, options: DatasetOptions) -> Table:
        part = loaded[split]
        # The Arrow table is memory-mapped; its rows become Python objects only below.
        check_rows(split, where, part.num_rows, max_rows)
        names = tuple(part.column_names)
        wanted = [name for name in options.columns if name in names]
        for name in wanted:
            # Image, Audio and other decoded features open the paths or URLs their values name.
            feature = part.features[name]
            if not isinstance(feature, (datasets.Value, datasets.ClassLabel)):
                raise DatasetError(
                    f"column {name!r} of split {split!r} of {where} holds {type(feature).__name__} values; cahp "
                    "reads texts as strings and labels as integers, strings or a ClassLabel"
                )
        plain = part.with_format(None)  # a format stored with the dataset must not change what is read
        values = {name: list(plain[name]) for name in wanted}
        feature = part.features.get(options.label_column)
        declared = tuple(feature.names) if isinstance(feature, datasets.ClassLabel) else None
        return Table(f"split {split!r} of {where}", names, values, part.num_rows, None, declared)

    return Source(splits=tuple(loaded), read=read)
