"""What the recovery tests share: a small, fast run whose dense model learns the task, and its data."""

from __future__ import annotations

import csv
from pathlib import Path

from cahp_engine.data import LabelledTexts, encode
from tests.support.tiny_models import make_texts, make_tokenizer

#: A small, fast run whose dense model learns the task (the saved random head counts as trained,
#: so dense fine-tuning is asked for).
FAST = {"resolution": 6, "signature_samples": "all", "calibration_fraction": 1.0, "stability_shards": 0,
        "epochs": 1, "dense_finetune": "always", "dense_epochs": 4, "dense_lr": 2e-3, "lr": 5e-4, "batch_size": 16,
        "latency_warmup": 0, "latency_repeats": 1, "export": "none", "seed": 5}


def encoded_texts(n: int, seed: int = 0):
    """``n`` encoded rows of the three-class synthetic task."""
    texts, labels = make_texts(n, num_classes=3, seed=seed)
    return encode(make_tokenizer(), LabelledTexts(tuple(texts), labels, ("a", "b", "c")), max_length=32)


def write_three_class_dataset(directory: Path, splits: dict[str, tuple[int, int]]) -> Path:
    """One CSV per split (``name -> (rows, seed)``) of the three-class synthetic task."""
    directory.mkdir(parents=True, exist_ok=True)
    for split, (n, seed) in splits.items():
        texts, labels = make_texts(n, num_classes=3, seed=seed)
        with open(directory / f"{split}.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(("text", "label"))
            writer.writerows(zip(texts, (int(y) for y in labels), strict=True))
    return directory
