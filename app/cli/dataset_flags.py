"""The dataset flags every command shares, one per :class:`DatasetOptions` field.

``--text-column``, ``--text-pair-column``, ``--label-column``, ``--train-split``, ``--eval-split`` and
``--dataset-config`` (the field ``config``, named for what it configures). Light: no torch.
"""

from __future__ import annotations

import argparse
from typing import Any

from cahp_engine.data import DATASET_OPTION_FIELDS, DatasetOptions

_HELP = {
    "text_column": "the column holding the text (default: text)",
    "label_column": "the column holding the class label (default: label)",
    "train_split": "the split to select heads and fine-tune on (default: train)",
    "text_pair_column": "second text of sentence-pair tasks (e.g. MNLI's hypothesis)",
    "eval_split": "default: the first labelled one of test, validation, validation_matched, dev, test_matched",
    "config": "configuration of a hub dataset, e.g. mnli for glue",
}


def flag(name: str) -> str:
    """The command-line flag of the option ``name``."""
    return "--dataset-config" if name == "config" else f"--{name.replace('_', '-')}"


def add_dataset_flags(group: Any, *, with_defaults: bool = True) -> None:
    """One flag per option; ``with_defaults=False`` leaves unset ones None (the server fills them in)."""
    for name in DATASET_OPTION_FIELDS:
        default = DatasetOptions.__dataclass_fields__[name].default if with_defaults else None
        group.add_argument(flag(name), dest=name, default=default, help=_HELP.get(name))


def dataset_options_from_args(args: argparse.Namespace) -> DatasetOptions:
    """The validated :class:`DatasetOptions` from parsed dataset flags (DatasetError if refused)."""
    return DatasetOptions(**{name: getattr(args, name) for name in DATASET_OPTION_FIELDS})
