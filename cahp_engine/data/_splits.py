"""Reading the labelled dataset a user names into a train and an eval :class:`LabelledTexts`.

A dataset reference is one of

* a directory of ``{split}.csv``, ``{split}.jsonl`` or ``{split}.parquet`` files (one file per split);
* a directory written by ``datasets.DatasetDict.save_to_disk`` (it holds ``dataset_dict.json``);
* a Hugging Face hub dataset id, ``org/name`` or ``name``, read with ``datasets.load_dataset`` (from
  the local cache when the hub cannot be reached).

Only the two splits in use are read, and no split of more than ``max_rows`` rows (checked from a
Parquet footer or a memory-mapped Arrow table before any row becomes a Python object, and while a
CSV or JSON Lines file is read). A directory's own JSON and YAML files may name only files inside it
(:mod:`cahp_engine.data._paths`). Every problem with the input is a
:class:`~cahp_engine.errors.DatasetError` whose message names the file, line, split or column and
says what to change. The ``datasets`` package is needed only for the last two kinds and is imported
when one of them is used.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from cahp_engine._validation import check_positive_int
from cahp_engine.data import LabelledTexts, encode_labels
from cahp_engine.data._files import files_source
from cahp_engine.data._hub import disk_source, has_repository_layout, hub_source, repository_source
from cahp_engine.data._options import (
    DATASET_OPTION_FIELDS,
    DEFAULT_EVAL_SPLITS,
    DEFAULT_MAX_ROWS,
    FILE_SUFFIXES,
    SPLIT_NAME,
    DatasetOptions,
    check_split_name,
)
from cahp_engine.data._profile import SplitProfile, check_splits, profile_table
from cahp_engine.data._table import Source, Table, check_classes, check_eval_labels
from cahp_engine.errors import DatasetError

__all__ = [
    "DATASET_OPTION_FIELDS",
    "DEFAULT_EVAL_SPLITS",
    "DEFAULT_MAX_ROWS",
    "FILE_SUFFIXES",
    "SPLIT_NAME",
    "DatasetFormat",
    "DatasetOptions",
    "DatasetSplits",
    "check_split_name",
    "load_splits",
]

DatasetFormat = Literal["files", "save_to_disk", "repository", "hub"]

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?\Z")


@dataclass(frozen=True)
class DatasetSplits:
    """The train and eval splits of a dataset, with labels mapped the same way in both.

    ``label_names[i]`` names class ``i`` in both ``train.labels`` and ``eval.labels``. ``source`` is
    the resolved directory or the hub id; ``splits_found`` lists every split the source has, and
    ``eval_split`` the one that was used for evaluation.
    """

    train: LabelledTexts
    eval: LabelledTexts
    label_names: tuple[str, ...]
    source: str
    format: DatasetFormat
    splits_found: tuple[str, ...]
    eval_split: str | None = None


def load_splits(
    ref: str | os.PathLike[str],
    options: DatasetOptions = DatasetOptions(),  # noqa: B008 - frozen, so one shared default is safe
    *,
    revision: str | None = None,
    cache_dir: str | None = None,
    token: str | None = None,
    max_rows: int | None = DEFAULT_MAX_ROWS,
) -> DatasetSplits:
    """Read the train and eval splits that ``options`` names from the dataset ``ref``.

    Parameters
    ----------
    ref : str or path
        A directory of ``{split}.csv|.jsonl|.parquet`` files, a ``save_to_disk`` directory, or a hub
        dataset id. A local directory wins over a hub id of the same name.
    options : DatasetOptions
        Columns and splits to use.
    revision, cache_dir, token
        Passed to ``datasets.load_dataset`` for hub ids; ignored for local directories.
    max_rows : int or None
        Most rows a split read may have (:data:`DEFAULT_MAX_ROWS`); None for no limit.

    Returns
    -------
    DatasetSplits
        ``train`` and ``eval`` with labels 0..C-1 from one mapping, and where they came from.

    Raises
    ------
    DatasetError
        For a missing or unreadable source, split, column, text or label; the message says what to change.
    """
    if not isinstance(ref, (str, os.PathLike)) or not os.fspath(ref).strip():
        raise DatasetError(f"`ref` must name a dataset directory or a hub dataset id, got {ref!r}")
    if max_rows is not None:
        check_positive_int("max_rows", max_rows)
    path = Path(ref).expanduser()
    if path.is_dir():
        # dataset_dict.json marks a saved DatasetDict; state.json a single saved Dataset, which
        # _disk_source turns away with a message saying to save a DatasetDict.
        if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
            _no_config(options, str(ref), "a save_to_disk directory")
            return _assemble(disk_source(path, max_rows), options, str(path.resolve()), "save_to_disk")
        if has_repository_layout(path):
            return _assemble(repository_source(path, options.config, cache_dir=cache_dir, max_rows=max_rows),
                             options, str(path.resolve()), "repository")
        _no_config(options, str(ref), "a directory of split files")
        return _assemble(files_source(path, max_rows), options, str(path.resolve()), "files")
    if path.exists():
        raise DatasetError(
            f"{str(ref)!r} is a file; pass the directory that holds it, with one file per split named "
            "like train.csv and test.csv"
        )
    text = os.fspath(ref)
    if not _HUB_ID.match(text):
        raise DatasetError(
            f"directory {text!r} does not exist; pass a directory of {{split}}.csv/.jsonl/.parquet files, "
            "a save_to_disk directory, or a hub dataset id like 'org/name'"
        )
    return _assemble(hub_source(text, revision, cache_dir, token, options.config, max_rows), options, text, "hub")


def _no_config(options: DatasetOptions, ref: str, kind: str) -> None:
    if options.config is not None:
        raise DatasetError(
            f"{ref!r} is {kind}, which has no configurations; drop `config` ({options.config!r}), or point at "
            "the hub dataset or the repository layout that has it"
        )


# --- assembling the splits ---------------------------------------------------------------------------


def _assemble(source: Source, options: DatasetOptions, where: str, fmt: DatasetFormat) -> DatasetSplits:
    found = source.splits
    tables: dict[str, Table] = {}
    profiles: dict[str, SplitProfile] = {}

    def profile(split: str) -> SplitProfile:
        if split not in profiles:
            tables[split] = source.read(split, options)
            profiles[split] = profile_table(tables[split])
        return profiles[split]

    # Every problem with the splits, columns, labels and texts is found here, in the words the job
    # service also uses at submit (cahp_engine.data._profile); what follows cannot fail on them.
    eval_split, _ = check_splits(found, profile, options, where)
    train, test = tables[options.train_split], tables[eval_split]
    train_codes, eval_codes, names = _map_labels(train, test, options.label_column)
    pair = options.text_pair_column

    def texts(table: Table, codes: np.ndarray) -> LabelledTexts:
        return LabelledTexts(
            texts=_texts(table, options.text_column),
            labels=codes,
            label_names=names,
            text_pairs=_texts(table, pair) if pair is not None else None,
        )

    return DatasetSplits(
        train=texts(train, train_codes),
        eval=texts(test, eval_codes),
        label_names=names,
        source=where,
        format=fmt,
        splits_found=found,
        eval_split=eval_split,
    )


def _texts(table: Table, column: str) -> tuple[str, ...]:
    values = table.values[column]
    # An empty CSV field is how a missing text looks there, so "" counts as missing in every format.
    missing = [i for i, v in enumerate(values) if v is None or v == "" or (isinstance(v, float) and math.isnan(v))]
    if missing:
        raise DatasetError(
            f"{len(missing)} of {table.rows} rows in {table.where} have no text in column {column!r} "
            f"(the first at {table.row(missing[0])}); fill or drop them"
        )
    for i, v in enumerate(values):
        if not isinstance(v, str):
            raise DatasetError(
                f"column {column!r} of {table.where} must hold text, but {table.row(i)} holds "
                f"{type(v).__name__} {v!r:.60}; point the column option at the text column, "
                "or store the texts as strings"
            )
    return tuple(values)


def _label_key(value: Any) -> Any:
    """One comparable key per raw label: ints for integral numbers, None for missing, else a string."""
    if value is None or isinstance(value, bool):
        return None if value is None else str(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        if math.isnan(value):
            return None
        return int(value) if float(value).is_integer() else str(value)
    return str(value)


def _map_labels(train: Table, test: Table, column: str) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """Map both splits' labels with the mapping that train alone defines."""
    train_keys = [_label_key(v) for v in train.values[column]]
    eval_keys = [_label_key(v) for v in test.values[column]]
    try:
        train_codes, names = encode_labels(train_keys, label_names=train.declared_labels)
    except DatasetError as err:
        raise DatasetError(f"{train.where}, column {column!r}: {err}") from None
    counts = np.bincount(train_codes, minlength=len(names))
    check_classes(train.where, column, names, [names[i] for i in np.flatnonzero(counts == 0)])
    missing = [i for i, k in enumerate(eval_keys) if k is None]
    check_eval_labels(train.where, test.where, column, rows=test.rows, missing=len(missing),
                      first_missing=test.row(missing[0]) if missing else None,
                      unseen=sorted({str(k) for k in set(eval_keys) - set(train_keys)}),
                      negative=any(isinstance(k, int) and k < 0 for k in eval_keys))
    # Same key set as train, so this reproduces train's names and extends the mapping to eval.
    codes, names = encode_labels(train_keys + eval_keys, label_names=train.declared_labels)
    return codes[: len(train_keys)], codes[len(train_keys) :], names
