"""A training split that is tokenised only where it is read.

Head selection reads a stratified sample of the training split whose size a stopping rule decides
(:mod:`cahp_engine.selection._convergence`); on a large split (MNLI's 393,000 pairs) most rows are never read.
:class:`LazyEncodedDataset` holds the texts and tokenises the rows a stage asks for, when it asks;
recovery fine-tuning, which reads every row, takes :meth:`LazyEncodedDataset.encode_all` once.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

import numpy as np

from cahp_engine.data._encoding import EncodedDataset, LabelledTexts, encode


class LazyEncodedDataset:
    """Labelled texts with the labels at hand and the token ids made on demand.

    Parameters
    ----------
    tokenizer : a transformers tokenizer
    data : LabelledTexts
    max_length : int
        Longer inputs are truncated to this many tokens.
    """

    def __init__(self, tokenizer: Any, data: LabelledTexts, *, max_length: int) -> None:
        self.tokenizer = tokenizer
        self.data = data
        self.max_length = max_length
        self.labels = np.asarray(data.labels, dtype=np.int64)
        self.num_classes = data.num_classes

    def __len__(self) -> int:
        return len(self.data)

    def take(self, indices: np.ndarray) -> EncodedDataset:
        """Tokenise the rows ``indices`` (in that order) and return them alone."""
        return encode(self.tokenizer, self.data.subset(indices), max_length=self.max_length)

    @cached_property
    def encoded(self) -> EncodedDataset:
        """Every row tokenised (once; later calls return the same object)."""
        return encode(self.tokenizer, self.data, max_length=self.max_length)


#: What head selection reads: a tokenised split, or one tokenised on demand.
TrainRows = EncodedDataset | LazyEncodedDataset


def take_rows(data: TrainRows, indices: np.ndarray) -> EncodedDataset:
    """The rows ``indices`` of ``data`` (in that order) as an :class:`EncodedDataset`.

    A lazy split tokenises just those rows; an already tokenised one is sliced.
    """
    idx = np.asarray(indices, dtype=np.int64)
    if isinstance(data, LazyEncodedDataset):
        return data.take(idx)
    return EncodedDataset(
        input_ids=tuple(data.input_ids[i] for i in idx),
        token_type_ids=None if data.token_type_ids is None else tuple(data.token_type_ids[i] for i in idx),
        labels=data.labels[idx],
        lengths=data.lengths[idx],
        num_classes=data.num_classes,
        pad_token_id=data.pad_token_id,
        padding_side=data.padding_side,
    )


def row_lengths(data: TrainRows, indices: np.ndarray) -> np.ndarray:
    """Token counts of the rows ``indices``; a lazy split tokenises them to count."""
    if isinstance(data, LazyEncodedDataset):
        return data.take(np.asarray(indices, dtype=np.int64)).lengths
    return data.lengths[np.asarray(indices, dtype=np.int64)]
