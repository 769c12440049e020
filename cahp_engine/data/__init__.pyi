"""Reading labelled datasets and turning them into token batches.

Reading order: ``_options`` (which columns and splits) -> ``_files`` / ``_hub`` (the sources) -> ``_table``
-> ``_splits`` (``load_splits``) -> ``_encoding`` (tokenise, batch) -> ``_lazy`` (tokenise on read)."""

from ._encoding import (
    collate, draw_subset, encode, encode_labels, EncodedDataset, iterate_batches, LabelledTexts,
    length_grouped_batches,
)
from ._lazy import LazyEncodedDataset, row_lengths, take_rows, TrainRows
from ._options import DATASET_OPTION_FIELDS, DEFAULT_EVAL_SPLITS, FILE_SUFFIXES, check_split_name, DatasetOptions
from ._splits import DatasetSplits, load_splits

__all__ = [
    "DATASET_OPTION_FIELDS", "DEFAULT_EVAL_SPLITS", "FILE_SUFFIXES", "check_split_name", "collate", "DatasetOptions",
    "DatasetSplits", "draw_subset", "encode", "encode_labels", "EncodedDataset", "iterate_batches", "LabelledTexts",
    "LazyEncodedDataset", "length_grouped_batches", "load_splits", "row_lengths", "take_rows", "TrainRows",
]
