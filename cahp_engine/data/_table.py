"""What every dataset source hands to :func:`cahp_engine.data.load_splits`: split names and
a reader returning one split's wanted columns as plain lists."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cahp_engine.data._options import DatasetOptions
from cahp_engine.errors import DatasetError

#: At most this many names in one message.
SHOWN = 20
#: Most columns a split file may have: a text classifier reads two or three. A header of 60,000
#: names is refused before a row is read.
MAX_COLUMNS = 10_000
#: Most bytes of one split: the file's size for CSV and JSON Lines, the decoded size of the wanted
#: columns for Parquet (whose dictionary pages let 857 bytes stand for 2 GB of text). SST-5's train
#: split is 1 MB, MNLI's 80 MB; the whole split is held in memory while a job runs.
MAX_SPLIT_BYTES = 1024**3
#: Longest name quoted in a message (a name is the file's own text).
_NAME_QUOTED = 80


@dataclass(frozen=True)
class Table:
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
class Source:
    """A dataset's split names and a reader for one split's wanted columns."""

    splits: tuple[str, ...]
    read: Callable[[str, DatasetOptions], Table]


def listed(names: Sequence[str]) -> str:
    """``'a', 'b'`` for a message, the first :data:`SHOWN` names and a count of the others."""
    if not names:
        return "(none)"
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return ", ".join(_quoted(n) for n in names[:SHOWN]) + more


def _quoted(name: str) -> str:
    text = repr(name[: _NAME_QUOTED + 1])
    return text if len(name) <= _NAME_QUOTED else text[: _NAME_QUOTED] + "...'"


def too_large(where: str, found: str) -> DatasetError:
    """The error for a split over :data:`MAX_SPLIT_BYTES` (``found``: what was seen)."""
    return DatasetError(
        f"{where} {found}, more than cahp's limit of {MAX_SPLIT_BYTES:,} bytes per split (MAX_SPLIT_BYTES); "
        "give it fewer or shorter rows (a sample of the split serves pruning as well)"
    )


def check_rows(split: str, where: str, rows: int, max_rows: int | None, *, declared: bool = False) -> None:
    """Refuse a split that has (or whose metadata declares) more than ``max_rows`` rows, before it is read."""
    if max_rows is not None and rows > max_rows:
        verb = "declares" if declared else "has"
        raise too_many_rows(split, where, max_rows, f"{verb} {rows} rows, over the limit of {max_rows} rows per split")


def too_many_rows(split: str, where: str, max_rows: int, found: str | None = None) -> DatasetError:
    """The error for a split over the row limit; ``found`` says what was seen (default: more than the limit)."""
    return DatasetError(
        f"split {split!r} ({where}) {found or f'has more than {max_rows} rows, the limit per split'}; give it at "
        f"most {max_rows} rows (a sample of the split serves pruning as well), or raise the limit "
        "(CAHP_MAX_DATASET_ROWS on a server, --max-dataset-rows for cahp prune)"
    )


def check_classes(where: str, column: str, names: Sequence[str], empty: Sequence[str]) -> None:
    """Refuse a training split with classes ``empty`` that have no samples, or with one class only."""
    if empty:
        raise DatasetError(
            f"classes {list(empty)[:SHOWN]} have no samples in {where}; add samples of each class, "
            "or drop the unused classes from the label list"
        )
    if len(names) < 2:
        raise DatasetError(
            f"{where} has one class only ({names[0]!r} in column {column!r}); a classifier needs "
            "at least two. Check `label_column`, and that the file holds the whole split"
        )


def check_eval_labels(train_where: str, test_where: str, column: str, *, rows: int, missing: int,
                      first_missing: object, unseen: Sequence[str], negative: bool) -> None:
    """Refuse an evaluation split (of ``rows`` rows) with ``missing`` unlabelled rows, or labels ``unseen`` in
    training (``negative``: some of them are negative, the mark of an unlabelled split)."""
    if missing:
        raise DatasetError(
            f"{missing} of {rows} rows in {test_where} have no label in column {column!r} "
            f"(the first at {first_missing}); fill or drop them"
        )
    if unseen:
        hint = (
            " The split looks unlabelled (negative labels); choose a labelled one with `eval_split`"
            if negative
            else " Add them to the train split, or drop those rows from the eval split"
        )
        raise DatasetError(f"{test_where} has labels {list(unseen)[:SHOWN]} that {train_where} does not have.{hint}")
