"""Reading labelled datasets and turning them into token batches.

Reading order: ``_options`` (which columns and splits) -> ``_files`` / ``_hub`` (the sources) -> ``_table``
-> ``_profile`` (the checks of splits, columns and labels)
-> ``_splits`` (``load_splits``) -> ``_encoding`` (tokenise, batch) -> ``_lazy`` (tokenise on read)."""

from ._card import CARD_FILES, MAX_YAML_DEPTH, check_card_text, check_repository, has_card_configs
from ._encoding import (
    EncodedDataset,
    LabelledTexts,
    collate,
    draw_subset,
    encode,
    encode_labels,
    iterate_batches,
    length_grouped_batches,
)
from ._hub import check_hub_data_files
from ._lazy import LazyEncodedDataset, TrainRows, row_lengths, take_rows
from ._options import (
    DATASET_OPTION_FIELDS,
    DEFAULT_EVAL_SPLITS,
    DEFAULT_MAX_ROWS,
    FILE_SUFFIXES,
    DatasetOptions,
    check_split_name,
)
from ._paths import SAVED_DICT, SAVED_STATE, check_saved_dataset, data_file_problem
from ._profile import DatasetProfile, SplitProfile, check_splits, profile_directory
from ._splits import DatasetSplits, load_splits
from ._table import MAX_COLUMNS, MAX_SPLIT_BYTES

__all__ = [
    "CARD_FILES", "MAX_COLUMNS", "MAX_SPLIT_BYTES", "MAX_YAML_DEPTH",
    "DATASET_OPTION_FIELDS", "DEFAULT_EVAL_SPLITS", "DEFAULT_MAX_ROWS", "FILE_SUFFIXES", "SAVED_DICT",
    "SAVED_STATE", "check_card_text", "check_hub_data_files", "check_repository", "check_saved_dataset",
    "check_split_name", "check_splits", "collate", "data_file_problem", "DatasetOptions", "DatasetProfile",
    "DatasetSplits", "draw_subset", "encode",
    "encode_labels", "EncodedDataset", "has_card_configs", "iterate_batches", "LabelledTexts", "LazyEncodedDataset",
    "length_grouped_batches", "load_splits", "profile_directory", "row_lengths", "SplitProfile", "take_rows",
    "TrainRows",
]
