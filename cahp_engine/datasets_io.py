"""Reading the labelled dataset a user names into a train and an eval :class:`LabelledTexts`.

A dataset reference is one of

* a directory of ``{split}.csv``, ``{split}.jsonl`` or ``{split}.parquet`` files (one file per split);
* a directory written by ``datasets.DatasetDict.save_to_disk`` (it holds ``dataset_dict.json``);
* a Hugging Face hub dataset id, ``org/name`` or ``name``, read with ``datasets.load_dataset`` (from
  the local cache when the hub cannot be reached).

Only the two splits in use are read. Every problem with the input is a
:class:`~cahp_engine.errors.DatasetError` whose message names the file, line, split or column and
says what to change. The ``datasets`` package is needed only for the last two kinds and is imported
when one of them is used.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from cahp_engine.data import LabelledTexts, encode_labels
from cahp_engine.errors import DatasetError

DatasetFormat = Literal["files", "save_to_disk", "hub"]

#: File suffixes read from a directory of split files, one file per split.
FILE_SUFFIXES: tuple[str, ...] = (".csv", ".jsonl", ".parquet")
#: Splits tried, in order, when ``DatasetOptions.eval_split`` is None.
DEFAULT_EVAL_SPLITS: tuple[str, ...] = ("test", "validation", "dev")

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?\Z")
_INTEGER = re.compile(r"^[+-]?\d+$")
_SHOWN = 20  # at most this many names in one message


@dataclass(frozen=True)
class DatasetOptions:
    """Which columns and splits of a dataset to use.

    Parameters
    ----------
    text_column : str
        Column holding the (first) text of each sample.
    text_pair_column : str or None
        Column holding the second text of sentence-pair tasks; None for single texts.
    label_column : str
        Column holding the class label: integers 0..C-1, or strings mapped to 0..C-1 in sorted order.
    train_split : str
        Split used for salience, clustering and fine-tuning.
    eval_split : str or None
        Split used for evaluation. None takes the first of ``DEFAULT_EVAL_SPLITS``
        ("test", "validation", "dev") that the dataset has.
    """

    text_column: str = "text"
    text_pair_column: str | None = None
    label_column: str = "label"
    train_split: str = "train"
    eval_split: str | None = None

    def __post_init__(self) -> None:
        for name in ("text_column", "label_column", "train_split"):
            _require_name(name, getattr(self, name))
        for name in ("text_pair_column", "eval_split"):
            if getattr(self, name) is not None:
                _require_name(name, getattr(self, name))
        for name in ("train_split", "eval_split"):
            if getattr(self, name) is not None:
                check_split_name(name, getattr(self, name))
        if self.text_column == self.label_column:
            raise DatasetError(f"`text_column` and `label_column` must differ, both are {self.text_column!r}")
        if self.text_pair_column in (self.text_column, self.label_column):
            raise DatasetError(
                f"`text_pair_column` must differ from `text_column` and `label_column`, got {self.text_pair_column!r}"
            )
        if self.eval_split == self.train_split:
            raise DatasetError(
                f"`eval_split` must differ from `train_split`, both are {self.train_split!r}; "
                "evaluating on the training data would hide the accuracy lost to pruning"
            )

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns read: text, the optional pair, and label."""
        pair = (self.text_pair_column,) if self.text_pair_column is not None else ()
        return (self.text_column, *pair, self.label_column)


#: A split name: letters, digits, ``_``, ``-`` and ``.``, not starting with a dot. Split names become
#: file names (``{split}.csv``), so nothing that could name another directory is accepted.
SPLIT_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,99}")


def check_split_name(name: str, value: str) -> str:
    """Return ``value`` if it is a valid split name, else raise :class:`DatasetError` saying why.

    Hugging Face split names (``train``, ``validation_matched``, ``test.en``) all qualify.
    """
    if not isinstance(value, str) or SPLIT_NAME.fullmatch(value) is None:
        raise DatasetError(
            f"`{name}` must be a split name of 1 to 100 letters, digits, `_`, `-` or `.` that does not start "
            f"with a dot, like `train` or `validation_matched`; got {value!r}"
        )
    return value


#: The option names, in order (what a job's ``dataset`` record and the CLI flags may carry).
DATASET_OPTION_FIELDS: tuple[str, ...] = ("text_column", "text_pair_column", "label_column", "train_split",
                                          "eval_split")


def _require_name(name: str, value: Any) -> None:
    if not isinstance(value, str) or not value.strip():
        raise DatasetError(f"`{name}` must be a non-empty string, got {value!r}")


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


@dataclass(frozen=True)
class _Table:
    """The wanted columns of one split as plain lists.

    ``names`` lists every column the split has (for messages); ``values`` holds only the wanted ones
    that exist. ``lines[i]`` is the file line where data row ``i`` starts, when the format has lines.
    """

    where: str
    names: tuple[str, ...]
    values: dict[str, list[Any]]
    rows: int
    lines: list[int] | None = None
    declared_labels: tuple[str, ...] | None = None

    def row(self, i: int) -> str:
        return f"line {self.lines[i]}" if self.lines is not None else f"row {i + 1}"


@dataclass(frozen=True)
class _Source:
    """A dataset's split names and a reader for one split's wanted columns."""

    splits: tuple[str, ...]
    read: Callable[[str, DatasetOptions], _Table]


def load_splits(
    ref: str | os.PathLike[str],
    options: DatasetOptions = DatasetOptions(),  # noqa: B008 - frozen, so one shared default is safe
    *,
    revision: str | None = None,
    cache_dir: str | None = None,
    token: str | None = None,
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
    path = Path(ref).expanduser()
    if path.is_dir():
        # dataset_dict.json marks a saved DatasetDict; state.json a single saved Dataset, which
        # _disk_source turns away with a message saying to save a DatasetDict.
        if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
            return _assemble(_disk_source(path), options, str(path.resolve()), "save_to_disk")
        return _assemble(_files_source(path), options, str(path.resolve()), "files")
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
    return _assemble(_hub_source(text, revision, cache_dir, token), options, text, "hub")


# --- assembling the splits ---------------------------------------------------------------------------


def _assemble(source: _Source, options: DatasetOptions, where: str, fmt: DatasetFormat) -> DatasetSplits:
    found = source.splits
    listed = ", ".join(repr(s) for s in found)
    if options.train_split not in found:
        raise DatasetError(
            f"{where} has no split {options.train_split!r}; its splits are {listed}. Set `train_split` to one of them"
        )
    eval_split = options.eval_split
    if eval_split is None:
        eval_split = next((s for s in DEFAULT_EVAL_SPLITS if s in found), None)
        if eval_split is None:
            raise DatasetError(
                f"{where} has none of the splits {', '.join(DEFAULT_EVAL_SPLITS)} to evaluate on; "
                f"its splits are {listed}. Set `eval_split` to one of them"
            )
    elif eval_split not in found:
        raise DatasetError(
            f"{where} has no split {eval_split!r}; its splits are {listed}. Set `eval_split` to one of them"
        )

    train = source.read(options.train_split, options)
    test = source.read(eval_split, options)
    for table in (train, test):
        _check_columns(table, options)
    if test.declared_labels != train.declared_labels and test.declared_labels is not None:
        raise DatasetError(
            f"{test.where} declares the classes {list(test.declared_labels)} but {train.where} declares "
            f"{list(train.declared_labels or ())}; both splits must use the same class list"
        )

    train_codes, eval_codes, names = _map_labels(train, test, options.label_column)
    pair = options.text_pair_column

    def texts(table: _Table, codes: np.ndarray) -> LabelledTexts:
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


def _check_columns(table: _Table, options: DatasetOptions) -> None:
    if table.rows == 0:
        raise DatasetError(f"{table.where} has no rows; give it at least one labelled sample per class")
    for key, column in (
        ("text_column", options.text_column),
        ("text_pair_column", options.text_pair_column),
        ("label_column", options.label_column),
    ):
        if column is not None and column not in table.values:
            raise DatasetError(
                f"{table.where} has no column {column!r}; its columns are {_names(table.names)}. "
                f"Set `{key}` to one of them"
            )


def _texts(table: _Table, column: str) -> tuple[str, ...]:
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


def _map_labels(train: _Table, test: _Table, column: str) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """Map both splits' labels with the mapping that train alone defines."""
    train_keys = [_label_key(v) for v in train.values[column]]
    eval_keys = [_label_key(v) for v in test.values[column]]
    try:
        train_codes, names = encode_labels(train_keys, label_names=train.declared_labels)
    except DatasetError as err:
        raise DatasetError(f"{train.where}, column {column!r}: {err}") from None
    counts = np.bincount(train_codes, minlength=len(names))
    if (counts == 0).any():
        empty = [names[i] for i in np.flatnonzero(counts == 0)]
        raise DatasetError(
            f"classes {empty[:_SHOWN]} have no samples in {train.where}; add samples of each class, "
            "or drop the unused classes from the label list"
        )
    if len(names) < 2:
        raise DatasetError(
            f"{train.where} has one class only ({names[0]!r} in column {column!r}); a classifier needs "
            "at least two. Check `label_column`, and that the file holds the whole split"
        )
    missing = [i for i, k in enumerate(eval_keys) if k is None]
    if missing:
        raise DatasetError(
            f"{len(missing)} of {test.rows} rows in {test.where} have no label in column {column!r} "
            f"(the first at {test.row(missing[0])}); fill or drop them"
        )
    unseen = sorted({str(k) for k in set(eval_keys) - set(train_keys)})
    if unseen:
        hint = (
            " The split looks unlabelled (negative labels); choose a labelled one with `eval_split`"
            if any(isinstance(k, int) and k < 0 for k in eval_keys)
            else " Add them to the train split, or drop those rows from the eval split"
        )
        raise DatasetError(f"{test.where} has labels {unseen[:_SHOWN]} that {train.where} does not have.{hint}")
    # Same key set as train, so this reproduces train's names and extends the mapping to eval.
    codes, names = encode_labels(train_keys + eval_keys, label_names=train.declared_labels)
    return codes[: len(train_keys)], codes[len(train_keys) :], names


def _names(names: Sequence[str]) -> str:
    if not names:
        return "(none)"
    more = f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
    return ", ".join(repr(n) for n in names[:_SHOWN]) + more


# --- a directory of split files ----------------------------------------------------------------------


def _files_source(root: Path) -> _Source:
    by_split: dict[str, Path] = {}
    for entry in sorted(root.iterdir()):
        if not entry.is_file() or entry.name.startswith(".") or entry.suffix.lower() not in FILE_SUFFIXES:
            continue
        if entry.stem in by_split:
            raise DatasetError(
                f"split {entry.stem!r} has two files in {root}: {by_split[entry.stem].name} and "
                f"{entry.name}; keep one of them"
            )
        by_split[entry.stem] = entry
    if not by_split:
        present = sorted(p.name + ("/" if p.is_dir() else "") for p in root.iterdir())
        raise DatasetError(
            f"{root} holds no split files; expected files like train.csv and test.csv (suffixes "
            f"{', '.join(FILE_SUFFIXES)}; JSON Lines must end in .jsonl). It holds {_names(present)}"
        )
    readers = {".csv": _read_csv, ".jsonl": _read_jsonl, ".parquet": _read_parquet}
    return _Source(
        splits=tuple(by_split),
        read=lambda split, options: readers[by_split[split].suffix.lower()](by_split[split], options),
    )


def _decoded(path: Path) -> str:
    data = path.read_bytes()
    if not data.strip():
        raise DatasetError(f"{path} is empty; write the split's labelled rows into it")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise DatasetError(
            f"{path} is not UTF-8: byte {data[err.start]:#04x} on line {line} cannot be decoded; "
            "re-save the file as UTF-8"
        ) from None
    return text.removeprefix("\ufeff")  # a byte-order mark some editors write


def _read_csv(path: Path, options: DatasetOptions) -> _Table:
    # The csv module rather than pandas: pandas fills a row with too few fields with NaN without a
    # word, and its type guessing turns texts such as "NA" or "null" into missing values.
    reader = csv.reader(io.StringIO(_decoded(path), newline=""))
    header: list[str] | None = None
    rows: list[list[str]] = []
    lines: list[int] = []
    while True:
        start = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as err:
            raise DatasetError(f"{path}, line {start}: {err}; fix the quoting of that row") from None
        if not row:
            continue  # blank line
        if header is None:
            header = row
            repeated = sorted({c for c in row if row.count(c) > 1})
            if repeated:
                raise DatasetError(f"{path} repeats the column names {repeated}; give every column its own name")
            continue
        if len(row) != len(header):
            raise DatasetError(
                f"{path}, line {start}: {len(row)} fields where the header has {len(header)}; quote fields "
                'that contain commas (like "a, b"), and give every row one value per column'
            )
        rows.append(row)
        lines.append(start)
    if header is None or not rows:
        raise DatasetError(f"{path} has a header but no rows; add at least one labelled row per class")
    values = {name: [r[i] for r in rows] for i, name in enumerate(header) if name in options.columns}
    if options.label_column in values:
        values[options.label_column] = _csv_labels(values[options.label_column])
    return _Table(str(path), tuple(header), values, len(rows), lines)


def _csv_labels(raw: list[str]) -> list[Any]:
    """CSV labels are text: whole numbers become ints, empty fields missing, anything else stays a string."""
    stripped = [v.strip() for v in raw]
    present = [v for v in stripped if v]
    as_int = bool(present) and all(_INTEGER.match(v) for v in present)
    return [None if not v else int(v) if as_int else v for v in stripped]


def _read_jsonl(path: Path, options: DatasetOptions) -> _Table:
    names: dict[str, None] = {}  # insertion-ordered set
    records: list[dict[str, Any]] = []
    lines: list[int] = []
    # split("\n"), not splitlines(): JSON strings may hold U+2028 and other characters splitlines breaks on.
    for number, line in enumerate(_decoded(path).split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise DatasetError(
                f"{path}, line {number} is not valid JSON ({err.msg}, column {err.colno}); "
                "write one JSON object per line"
            ) from None
        if not isinstance(record, dict):
            raise DatasetError(
                f"{path}, line {number} holds a JSON {type(record).__name__}, not an object; "
                'write one object per line, like {"text": "...", "label": 0}'
            )
        names.update(dict.fromkeys(record))
        records.append(record)
        lines.append(number)
    values = {name: [r.get(name) for r in records] for name in options.columns if name in names}
    return _Table(str(path), tuple(names), values, len(records), lines)


def _read_parquet(path: Path, options: DatasetOptions) -> _Table:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.stat().st_size == 0:
        raise DatasetError(f"{path} is empty; write the split into it again")
    try:
        names = tuple(pq.read_schema(path).names)
        table = pq.read_table(path, columns=[c for c in options.columns if c in names])
    except (pa.ArrowException, OSError) as err:
        raise DatasetError(
            f"{path} cannot be read as Parquet ({err}); write it again, e.g. with DataFrame.to_parquet"
        ) from None
    values = {name: table.column(name).to_pylist() for name in table.column_names}
    return _Table(str(path), names, values, table.num_rows)


# --- datasets: save_to_disk directories and hub ids ---------------------------------------------------


def _import_datasets(what: str) -> Any:
    try:
        import datasets
    except ImportError:
        raise DatasetError(
            f"reading {what} needs the optional `datasets` package; install it with `pip install cahp[hub]`, "
            "or pass a directory of .csv/.jsonl/.parquet split files"
        ) from None
    return datasets


def _disk_source(root: Path) -> _Source:
    datasets = _import_datasets("a save_to_disk directory")
    try:
        loaded = datasets.load_from_disk(str(root))
    except (OSError, ValueError, KeyError) as err:
        raise DatasetError(f"{root} cannot be read with datasets.load_from_disk ({err}); save it again") from None
    return _dict_source(datasets, loaded, f"{root}")


def _hub_source(ref: str, revision: str | None, cache_dir: str | None, token: str | None) -> _Source:
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


def _dict_source(datasets: Any, loaded: Any, where: str) -> _Source:
    if not isinstance(loaded, datasets.DatasetDict):
        raise DatasetError(
            f"{where} holds a single {type(loaded).__name__}, not a DatasetDict of splits; save a "
            "DatasetDict({'train': ..., 'test': ...}) instead"
        )

    def read(split: str, options: DatasetOptions) -> _Table:
        part = loaded[split]
        names = tuple(part.column_names)
        values = {name: list(part[name]) for name in options.columns if name in names}
        feature = part.features.get(options.label_column)
        declared = tuple(feature.names) if isinstance(feature, datasets.ClassLabel) else None
        return _Table(f"split {split!r} of {where}", names, values, part.num_rows, None, declared)

    return _Source(splits=tuple(loaded), read=read)
