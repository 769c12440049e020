"""Labelled text data, tokenisation and length-grouped batching.

Everything downstream works on :class:`EncodedDataset`: token ids without padding plus integer
labels. Batches are padded dynamically to their longest member, and samples are grouped by length
so that almost no compute is spent on padding tokens.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from cahp_engine.errors import DatasetError


@dataclass(frozen=True)
class LabelledTexts:
    """A labelled split: texts (and optional second texts for sentence pairs) with labels 0..C-1."""

    texts: tuple[str, ...]
    labels: np.ndarray
    label_names: tuple[str, ...]
    text_pairs: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if len(self.texts) != len(self.labels):
            raise DatasetError(f"{len(self.texts)} texts but {len(self.labels)} labels; give one label per text")
        if self.text_pairs is not None and len(self.text_pairs) != len(self.texts):
            raise DatasetError(
                f"{len(self.texts)} texts but {len(self.text_pairs)} paired texts; give one pair per text"
            )

    @property
    def num_classes(self) -> int:
        return len(self.label_names)

    def __len__(self) -> int:
        return len(self.texts)

    def subset(self, indices: Sequence[int] | np.ndarray) -> LabelledTexts:
        idx = np.asarray(indices, dtype=np.int64)
        return LabelledTexts(
            texts=tuple(self.texts[i] for i in idx),
            labels=self.labels[idx],
            label_names=self.label_names,
            text_pairs=None if self.text_pairs is None else tuple(self.text_pairs[i] for i in idx),
        )


def encode_labels(
    raw: Sequence[Any], *, label_names: Sequence[str] | None = None
) -> tuple[np.ndarray, tuple[str, ...]]:
    """Map raw labels to integers 0..C-1.

    Integer labels (or integral floats) must already be 0..C-1 and are kept as they are. String labels
    are mapped in sorted order, or in the order of ``label_names`` when it is given.

    Raises
    ------
    DatasetError
        For missing labels, integers that are not 0..C-1, or strings not in ``label_names``.
    """
    values = list(raw)
    if not values:
        raise DatasetError("the dataset has no rows; give at least two labelled samples per class")
    if any(v is None or (isinstance(v, float) and math.isnan(v)) for v in values):
        raise DatasetError("some rows have no label; fill or drop them")
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values) or all(
        isinstance(v, (float, np.floating)) and float(v).is_integer() for v in values
    ):
        ints = np.asarray(values, dtype=np.int64)
        present = np.unique(ints)
        if ints.min() < 0 or present.size != ints.max() + 1:
            raise DatasetError(
                f"integer labels must be 0..C-1 with every class present; found {present[:20].tolist()}"
                f"{' ...' if present.size > 20 else ''}. Renumber them, or give them as strings to be mapped"
            )
        names = tuple(label_names) if label_names is not None else tuple(str(i) for i in range(int(ints.max()) + 1))
        return ints, names
    strings = [str(v) for v in values]
    if label_names is None:
        names = tuple(sorted(set(strings)))
    else:
        names = tuple(label_names)
        unknown = sorted(set(strings) - set(names))
        if unknown:
            raise DatasetError(f"labels {unknown[:10]} are not among the known labels {list(names)[:20]}")
    index = {name: i for i, name in enumerate(names)}
    return np.asarray([index[s] for s in strings], dtype=np.int64), names


@dataclass(frozen=True)
class EncodedDataset:
    """Tokenised samples without padding.

    ``input_ids[i]`` and ``token_type_ids[i]`` are the unpadded ids of sample ``i``; ``lengths[i]``
    is their count.
    """

    input_ids: tuple[tuple[int, ...], ...]
    token_type_ids: tuple[tuple[int, ...], ...] | None
    labels: np.ndarray
    lengths: np.ndarray
    num_classes: int
    pad_token_id: int
    padding_side: str = "right"

    def __len__(self) -> int:
        return len(self.input_ids)


def encode(tokenizer: Any, data: LabelledTexts, *, max_length: int) -> EncodedDataset:
    """Tokenise ``data`` with ``tokenizer`` (truncating to ``max_length``), without padding."""
    if len(data) == 0:
        raise DatasetError("the dataset has no rows; give at least two labelled samples per class")
    limit = min(max_length, int(getattr(tokenizer, "model_max_length", max_length) or max_length))
    enc = tokenizer(
        list(data.texts),
        list(data.text_pairs) if data.text_pairs is not None else None,
        truncation=True,
        max_length=limit,
        padding=False,
    )
    ids = tuple(tuple(x) for x in enc["input_ids"])
    types = tuple(tuple(x) for x in enc["token_type_ids"]) if "token_type_ids" in enc else None
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return EncodedDataset(
        input_ids=ids,
        token_type_ids=types,
        labels=np.asarray(data.labels, dtype=np.int64),
        lengths=np.asarray([len(x) for x in ids], dtype=np.int64),
        num_classes=data.num_classes,
        pad_token_id=int(pad),
        padding_side=str(getattr(tokenizer, "padding_side", "right")),
    )


def length_grouped_batches(
    lengths: np.ndarray,
    indices: np.ndarray,
    batch_size: int,
    *,
    shuffle_seed: int | None = None,
    longest_first: bool = False,
) -> list[np.ndarray]:
    """Split ``indices`` into batches of similar length.

    Without a seed the batches run from shortest to longest, deterministically, or from longest to
    shortest with ``longest_first`` (the largest buffers are then allocated first and later, smaller
    ones reuse them, so the allocator's footprint does not creep up with the lengths). With a seed, the
    samples are shuffled, cut into mega-batches of 50 batches, each sorted by length, and the batch
    order is shuffled: training still sees random batches, with little padding.
    """
    indices = np.asarray(indices, dtype=np.int64)
    batches: list[np.ndarray] = []
    if shuffle_seed is None:
        order = indices[np.argsort(lengths[indices], kind="stable")]
        batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
        return batches[::-1] if longest_first else batches
    rng = np.random.default_rng(shuffle_seed)
    shuffled = rng.permutation(indices)
    mega = batch_size * 50
    for start in range(0, len(shuffled), mega):
        chunk = shuffled[start : start + mega]
        chunk = chunk[np.argsort(-lengths[chunk], kind="stable")]
        batches.extend(chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size))
    return [batches[i] for i in rng.permutation(len(batches))]


def collate(data: EncodedDataset, batch: np.ndarray, *, padding_side: str | None = None) -> dict[str, torch.Tensor]:
    """Pad the samples ``batch`` to their longest member.

    Returns ``input_ids``, ``attention_mask`` (1 on real tokens), ``token_type_ids`` when the
    tokenizer makes them, and ``labels``; all of shape (n, T) except labels (n,).
    """
    side = padding_side or data.padding_side
    n = len(batch)
    width = int(data.lengths[batch].max())
    ids = torch.full((n, width), data.pad_token_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    types = torch.zeros((n, width), dtype=torch.long) if data.token_type_ids is not None else None
    for row, i in enumerate(batch):
        seq = data.input_ids[i]
        span = slice(0, len(seq)) if side == "right" else slice(width - len(seq), width)
        ids[row, span] = torch.tensor(seq, dtype=torch.long)
        mask[row, span] = 1
        if types is not None and data.token_type_ids is not None:
            types[row, span] = torch.tensor(data.token_type_ids[i], dtype=torch.long)
    out = {"input_ids": ids, "attention_mask": mask, "labels": torch.as_tensor(data.labels[batch], dtype=torch.long)}
    if types is not None:
        out["token_type_ids"] = types
    return out


def iterate_batches(
    data: EncodedDataset, batches: Sequence[np.ndarray], device: torch.device | str = "cpu"
) -> Iterator[dict[str, torch.Tensor]]:
    """Collate each batch and move it to ``device``."""
    for batch in batches:
        yield {k: v.to(device) for k, v in collate(data, batch).items()}


def draw_subset(n: int, amount: int | float | None, *, seed: int, labels: np.ndarray | None = None) -> np.ndarray:
    """Indices of a seeded random subset: all (``None``), a count (int) or a fraction (float).

    With ``labels`` the draw is stratified so every class keeps its share (and at least one sample
    when the class has any).
    """
    if amount is None:
        return np.arange(n, dtype=np.int64)
    count = int(amount) if isinstance(amount, (int, np.integer)) else max(1, int(round(float(amount) * n)))
    count = min(count, n)
    rng = np.random.default_rng(seed)
    if labels is None or count == n:
        return np.sort(rng.choice(n, size=count, replace=False)).astype(np.int64)
    chosen: list[np.ndarray] = []
    classes = np.unique(labels)
    for c in classes:
        members = np.flatnonzero(labels == c)
        take = max(1, int(round(count * len(members) / n)))
        chosen.append(rng.choice(members, size=min(take, len(members)), replace=False))
    return np.sort(np.concatenate(chosen)).astype(np.int64)
