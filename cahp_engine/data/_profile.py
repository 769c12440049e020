"""What a split's columns hold, in a few numbers, and every check :func:`load_splits` makes on them.

A :class:`SplitProfile` says, for each column, what the column would give as text (missing values,
the first value that is not text) and as labels (the distinct label keys and their counts, missing
labels, whether every label is -1). :func:`check_splits` runs on profiles every check that
:func:`~cahp_engine.data.load_splits` runs on the rows: the splits exist, the columns exist, the
labels make at least two classes that both splits share, no text or label is missing. It is the
one place these messages are made: ``load_splits`` calls it on the tables it read, and the job
service calls it at submit on profiles taken when a dataset was uploaded (``JSON`` both ways), so a
mistake is refused at once with the words the worker would use hours later.

Light: no numpy, no torch.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cahp_engine.data._card import has_card_configs
from cahp_engine.data._files import EVERY_COLUMN, csv_labels, files_source, read_split
from cahp_engine.data._options import DEFAULT_EVAL_SPLITS, FILE_SUFFIXES, DatasetOptions
from cahp_engine.data._paths import SAVED_DICT, SAVED_STATE
from cahp_engine.data._table import Table, check_classes, check_eval_labels, listed
from cahp_engine.errors import DatasetError

#: More distinct values than this, and a column is not profiled as labels (no classifier has that many).
MAX_PROFILED_LABELS = 1000
#: A label key: an int for integral numbers, else the value's text (see :func:`label_key`).
LabelKey = int | str


@dataclass(frozen=True)
class ColumnProfile:
    """One column of one split, as text and as labels.

    Attributes
    ----------
    missing_text : int
        Rows without a text (None, "", NaN); ``first_missing_text`` names the first (``line 3``).
    non_text : tuple of (row, type name, value) or None
        The first value that is not a string, as messages show it.
    labels : tuple of (key, count) or None
        The distinct label keys (missing ones aside) with their counts, in first-seen order; None
        when there are more than :data:`MAX_PROFILED_LABELS`.
    missing_labels : int
        Rows without a label; ``first_missing_label`` names the first.
    unlabelled : bool
        Every label is -1 (how GLUE marks its hidden test labels).
    """

    missing_text: int = 0
    first_missing_text: str | None = None
    non_text: tuple[str, str, str] | None = None
    labels: tuple[tuple[LabelKey, int], ...] | None = ()
    missing_labels: int = 0
    first_missing_label: str | None = None
    unlabelled: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"missing_text": self.missing_text, "first_missing_text": self.first_missing_text,
                "non_text": list(self.non_text) if self.non_text else None,
                "labels": [list(pair) for pair in self.labels] if self.labels is not None else None,
                "missing_labels": self.missing_labels, "first_missing_label": self.first_missing_label,
                "unlabelled": self.unlabelled}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ColumnProfile:
        labels = data.get("labels")
        non_text = data.get("non_text")
        return cls(missing_text=int(data["missing_text"]), first_missing_text=data.get("first_missing_text"),
                   non_text=(str(non_text[0]), str(non_text[1]), str(non_text[2])) if non_text else None,
                   labels=None if labels is None else tuple((_json_key(k), int(n)) for k, n in labels),
                   missing_labels=int(data["missing_labels"]), first_missing_label=data.get("first_missing_label"),
                   unlabelled=bool(data["unlabelled"]))


@dataclass(frozen=True)
class SplitProfile:
    """One split: where it is, its columns, its row count, and a :class:`ColumnProfile` per profiled column."""

    where: str
    names: tuple[str, ...]
    rows: int
    columns: dict[str, ColumnProfile]
    declared_labels: tuple[str, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"where": self.where, "names": list(self.names), "rows": self.rows,
                "columns": {name: column.to_dict() for name, column in self.columns.items()},
                "declared_labels": list(self.declared_labels) if self.declared_labels is not None else None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SplitProfile:
        declared = data.get("declared_labels")
        return cls(where=str(data["where"]), names=tuple(str(n) for n in data["names"]), rows=int(data["rows"]),
                   columns={str(k): ColumnProfile.from_dict(v) for k, v in data["columns"].items()},
                   declared_labels=tuple(str(n) for n in declared) if declared is not None else None)

    def at(self, where: str) -> SplitProfile:
        """The same profile, named ``where`` in messages (a file's place as the caller knows it)."""
        return replace(self, where=where)


def label_key(value: Any) -> LabelKey | None:
    """One comparable key per raw label: ints for integral numbers, None for missing, else a string."""
    if value is None or isinstance(value, bool):
        return None if value is None else str(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if math.isnan(value):
            return None
        return int(value) if value.is_integer() else str(value)
    if type(value).__module__ == "numpy":  # numpy scalars, without importing numpy here
        return label_key(value.item())
    return str(value)


def profile_table(table: Table, *, csv_labels: Callable[[list[Any]], list[Any]] | None = None,
                  label_columns: Collection[str] | None = None) -> SplitProfile:
    """Profile every column ``table`` holds values for.

    ``csv_labels`` turns a CSV column's raw strings into labels as the CSV reader does (whole numbers
    become ints); ``label_columns`` limits that to these columns (None: every one, for a profile taken
    before anyone chose the label column).
    """
    columns = {}
    for name, values in table.values.items():
        as_labels = values
        if csv_labels is not None and (label_columns is None or name in label_columns):
            as_labels = csv_labels(values)
        columns[name] = _profile_column(table, values, as_labels)
    return SplitProfile(where=table.where, names=table.names, rows=table.rows, columns=columns,
                        declared_labels=table.declared_labels)


def _profile_column(table: Table, values: Sequence[Any], labels: Sequence[Any]) -> ColumnProfile:
    missing = [i for i, v in enumerate(values) if v is None or v == "" or (isinstance(v, float) and math.isnan(v))]
    # Only read when nothing is missing (a missing text is reported first), as load_splits does.
    non_text = next(((table.row(i), type(v).__name__, f"{v!r:.60}") for i, v in enumerate(values)
                     if not isinstance(v, str)), None) if not missing else None
    keys = [label_key(v) for v in labels]
    absent = [i for i, k in enumerate(keys) if k is None]
    counts = Counter(k for k in keys if k is not None)
    return ColumnProfile(
        missing_text=len(missing), first_missing_text=table.row(missing[0]) if missing else None, non_text=non_text,
        labels=tuple(counts.items()) if len(counts) <= MAX_PROFILED_LABELS else None,
        missing_labels=len(absent), first_missing_label=table.row(absent[0]) if absent else None,
        unlabelled=bool(values) and all(str(v).strip() == "-1" for v in values),
    )


def check_splits(found: Sequence[str], profile: Callable[[str], SplitProfile], options: DatasetOptions,
                 where: str) -> tuple[str, tuple[str, ...]]:
    """Raise the first problem :func:`load_splits` would find with ``options``; the eval split and the class names.

    Parameters
    ----------
    found : the dataset's split names
    profile : callable (split) -> SplitProfile
        A split's profile, read when needed (only the splits ``options`` lead to are read).
    options : the columns and splits to use
    where : how messages name the dataset (its directory, or the name the caller knows it by)

    Raises
    ------
    DatasetError
        The message says what to change, as when the job runs.
    """
    listed_splits = ", ".join(repr(s) for s in found)
    if options.train_split not in found:
        raise DatasetError(f"{where} has no split {options.train_split!r}; its splits are {listed_splits}. "
                           "Set `train_split` to one of them")
    eval_split = options.eval_split
    if eval_split is None:
        unlabelled = []
        for candidate in (s for s in DEFAULT_EVAL_SPLITS if s in found and s != options.train_split):
            column = profile(candidate).columns.get(options.label_column)
            if column is not None and column.unlabelled:
                unlabelled.append(candidate)
                continue
            eval_split = candidate
            break
        if eval_split is None:
            skipped = f" ({', '.join(unlabelled)} has no labels: every one is -1)" if unlabelled else ""
            raise DatasetError(
                f"{where} has none of the splits {', '.join(DEFAULT_EVAL_SPLITS)} with labels to evaluate on"
                f"{skipped}; its splits are {listed_splits}. Set `eval_split` to one of them"
            )
    elif eval_split not in found:
        raise DatasetError(f"{where} has no split {eval_split!r}; its splits are {listed_splits}. "
                           "Set `eval_split` to one of them")
    train, test = profile(options.train_split), profile(eval_split)
    for split in (train, test):
        _check_columns(split, options)
    if test.declared_labels != train.declared_labels and test.declared_labels is not None:
        raise DatasetError(
            f"{test.where} declares the classes {list(test.declared_labels)} but {train.where} declares "
            f"{list(train.declared_labels or ())}; both splits must use the same class list"
        )
    names = _check_labels(train, test, options.label_column)
    for split in (train, test):
        for text in (options.text_column, options.text_pair_column):
            if text is not None:
                _check_texts(split, text)
    return eval_split, names


def _check_columns(split: SplitProfile, options: DatasetOptions) -> None:
    if split.rows == 0:
        raise DatasetError(f"{split.where} has no rows; give it at least one labelled sample per class")
    for key, column in (("text_column", options.text_column), ("text_pair_column", options.text_pair_column),
                        ("label_column", options.label_column)):
        if column is not None and column not in split.columns:
            raise DatasetError(f"{split.where} has no column {column!r}; its columns are {listed(split.names)}. "
                               f"Set `{key}` to one of them")


def _check_labels(train: SplitProfile, test: SplitProfile, column: str) -> tuple[str, ...]:
    """The class names train's labels define; the errors of the labels of both splits."""
    ours, theirs = train.columns[column], test.columns[column]
    if ours.labels is None or theirs.labels is None:
        return ()  # too many distinct values to profile: the worker's own reading says what is wrong
    try:
        names = _class_names(ours, train.declared_labels)
    except DatasetError as err:
        raise DatasetError(f"{train.where}, column {column!r}: {err}") from None
    empty: list[str] = []
    if train.declared_labels is not None:
        present = {_class_index(k, names) for k, _ in ours.labels}
        empty = [name for i, name in enumerate(names) if i not in present]
    check_classes(train.where, column, names, empty)
    train_keys = {k for k, _ in ours.labels}
    check_eval_labels(
        train.where, test.where, column, rows=test.rows, missing=theirs.missing_labels,
        first_missing=theirs.first_missing_label,
        unseen=sorted({str(k) for k, _ in theirs.labels if k not in train_keys}),
        negative=any(isinstance(k, int) and k < 0 for k, _ in theirs.labels),
    )
    return names


def _class_names(column: ColumnProfile, declared: tuple[str, ...] | None) -> tuple[str, ...]:
    """The class names of a training column's labels, with :func:`~cahp_engine.data.encode_labels`' errors."""
    assert column.labels is not None
    if column.missing_labels:
        raise DatasetError("some rows have no label; fill or drop them")
    keys = [k for k, _ in column.labels]
    if not keys:
        raise DatasetError("the dataset has no rows; give at least two labelled samples per class")
    ints = [k for k in keys if isinstance(k, int)]
    if len(ints) == len(keys):
        present = sorted(set(ints))
        if present[0] < 0 or len(present) != present[-1] + 1:
            raise DatasetError(
                f"integer labels must be 0..C-1 with every class present; found {present[:20]}"
                f"{' ...' if len(present) > 20 else ''}. Renumber them, or give them as strings to be mapped"
            )
        return declared if declared is not None else tuple(str(i) for i in range(present[-1] + 1))
    strings = {str(k) for k in keys}
    if declared is None:
        return tuple(sorted(strings))
    unknown = sorted(strings - set(declared))
    if unknown:
        raise DatasetError(f"labels {unknown[:10]} are not among the known labels {list(declared)[:20]}")
    return declared


def _class_index(key: LabelKey, names: tuple[str, ...]) -> int:
    return key if isinstance(key, int) else names.index(str(key))


def _check_texts(split: SplitProfile, column: str) -> None:
    profile = split.columns[column]
    if profile.missing_text:
        raise DatasetError(
            f"{profile.missing_text} of {split.rows} rows in {split.where} have no text in column {column!r} "
            f"(the first at {profile.first_missing_text}); fill or drop them"
        )
    if profile.non_text is not None:
        row, kind, shown = profile.non_text
        raise DatasetError(
            f"column {column!r} of {split.where} must hold text, but {row} holds {kind} {shown}; point the column "
            "option at the text column, or store the texts as strings"
        )


def _json_key(value: Any) -> LabelKey:
    return value if isinstance(value, int) and not isinstance(value, bool) else str(value)


@dataclass(frozen=True)
class DatasetProfile:
    """A dataset directory, profiled before anyone chose its options.

    Attributes
    ----------
    format : {"files", "save_to_disk", "repository"}
        How :func:`~cahp_engine.data.load_splits` would read it; only ``files`` is profiled.
    splits : tuple of str
        The split names it has.
    profiles : dict of str to SplitProfile
        Every column of each split that could be read.
    errors : dict of str to str
        For a split that cannot be read, what reading it said (raised when a run uses the split).
    error : str or None
        Why the directory cannot be read as split files at all.
    """

    format: str
    splits: tuple[str, ...] = ()
    profiles: dict[str, SplitProfile] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    error: str | None = None

    def check(self, options: DatasetOptions, where: str) -> None:
        """Raise what :func:`~cahp_engine.data.load_splits` would for ``options`` (nothing for other formats).

        ``where`` names the directory as the messages should.
        """
        if self.error is not None:
            raise DatasetError(self.error)
        if self.format != "files":
            return

        def profile(split: str) -> SplitProfile:
            if split in self.errors:
                raise DatasetError(self.errors[split])
            return self.profiles[split]

        check_splits(self.splits, profile, options, where)

    def to_dict(self) -> dict[str, Any]:
        return {"format": self.format, "splits": list(self.splits),
                "profiles": {k: v.to_dict() for k, v in self.profiles.items()}, "errors": dict(self.errors),
                "error": self.error}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DatasetProfile:
        return cls(format=str(data["format"]), splits=tuple(str(s) for s in data.get("splits", ())),
                   profiles={str(k): SplitProfile.from_dict(v) for k, v in data.get("profiles", {}).items()},
                   errors={str(k): str(v) for k, v in data.get("errors", {}).items()}, error=data.get("error"))


def profile_directory(root: Path, *, max_rows: int | None) -> DatasetProfile:
    """Profile every split file of the dataset directory ``root`` (see :class:`DatasetProfile`).

    Reads each split file whole, every column, as the worker would read the two a job uses; a split
    over ``max_rows`` rows is recorded as the error reading it gives.
    """
    if (root / SAVED_DICT).is_file() or (root / SAVED_STATE).is_file():
        return DatasetProfile(format="save_to_disk")
    try:
        if has_card_configs(root):
            return DatasetProfile(format="repository")
        source = files_source(root, max_rows)
    except DatasetError as exc:
        return DatasetProfile(format="files", error=str(exc))
    profiles: dict[str, SplitProfile] = {}
    errors: dict[str, str] = {}
    for split in source.splits:
        path = next(p for p in root.iterdir() if p.stem == split and p.suffix.lower() in FILE_SUFFIXES)
        try:
            table = read_split(path, EVERY_COLUMN, max_rows)
        except DatasetError as exc:
            errors[split] = str(exc)
            continue
        profiles[split] = profile_table(table, csv_labels=csv_labels if path.suffix.lower() == ".csv" else None)
    return DatasetProfile(format="files", splits=source.splits, profiles=profiles, errors=errors)
