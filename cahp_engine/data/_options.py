"""Which columns and splits of a dataset to use: the options, their names and the split-name rule.

Importable without torch, numpy or ``datasets``: the command line and the job service build their
options from :data:`DATASET_OPTION_FIELDS` and check split names with :func:`check_split_name`
before any data is read. Reading lives in :mod:`cahp_engine.data._splits`.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from cahp_engine.errors import DatasetError

#: File suffixes read from a directory of split files, one file per split.
FILE_SUFFIXES: tuple[str, ...] = (".csv", ".jsonl", ".parquet")
#: Splits tried, in order, when ``DatasetOptions.eval_split`` is None; one whose labels are all -1
#: (GLUE's unlabelled test splits) is passed over. MNLI's ``validation_matched`` comes before its
#: ``validation_mismatched``, which ``eval_split`` can name.
DEFAULT_EVAL_SPLITS: tuple[str, ...] = ("test", "validation", "validation_matched", "dev", "test_matched")
#: A split name: letters, digits, ``_``, ``-`` and ``.``, not starting with a dot. Split names become
#: file names (``{split}.csv``), so nothing that could name another directory is accepted.
SPLIT_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,99}")
#: Most rows one split may have (or declare) before any of it is read. Five times MNLI's 393,000 pairs
#: and above every GLUE and SuperGLUE training split; at a few hundred bytes of Python strings a row,
#: a split at the limit takes about a gigabyte in memory. A tiny file cannot declare millions of rows.
DEFAULT_MAX_ROWS = 2_000_000


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
        Split used for evaluation. None takes the first of ``DEFAULT_EVAL_SPLITS`` ("test",
        "validation", "validation_matched", "dev", "test_matched") that the dataset has with labels
        (a split whose labels are all -1, like GLUE's test splits, is passed over).
    config : str or None
        Configuration of a hub dataset (``glue`` has ``mnli``, ``sst2``, ...), or of a local
        repository layout whose ``README.md`` lists ``configs``; ``datasets.load_dataset``'s ``name``.
    """

    text_column: str = "text"
    text_pair_column: str | None = None
    label_column: str = "label"
    train_split: str = "train"
    eval_split: str | None = None
    config: str | None = None

    def __post_init__(self) -> None:
        for name in ("text_column", "label_column", "train_split"):
            _require_name(name, getattr(self, name))
        for name in ("text_pair_column", "eval_split"):
            if getattr(self, name) is not None:
                _require_name(name, getattr(self, name))
        for name in ("train_split", "eval_split"):
            if getattr(self, name) is not None:
                check_split_name(name, getattr(self, name))
        if self.config is not None and (not isinstance(self.config, str) or SPLIT_NAME.fullmatch(self.config) is None):
            raise DatasetError(
                "`config` must be a dataset configuration name of 1 to 100 letters, digits, `_`, `-` or `.`, "
                f"like `mnli`; got {self.config!r}"
            )
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


#: The option names, in field order: ``text_column``, ``text_pair_column``, ``label_column``,
#: ``train_split``, ``eval_split``, ``config``.
DATASET_OPTION_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(DatasetOptions))


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


def _require_name(name: str, value: Any) -> None:
    if not isinstance(value, str) or not value.strip():
        raise DatasetError(f"`{name}` must be a non-empty string, got {value!r}")
