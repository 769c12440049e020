"""A tiny classifier that no pruned copy of itself can match: for a test of a missed accuracy budget.

Tiny random models carry their task in many redundant heads, so a copy without one head usually
answers as the dense model does and meets any budget. Here the heads of each layer are built to
cancel each other: one value dimension of every head is the constant 1 (its weights zeroed, its bias
1), and the output projection sends it along one direction of the hidden space with the weights
``big, big, ..., -(H - 1) big``, which sum to zero. The dense model is unchanged by this (the terms
cancel), while removing any head leaves an offset of ``big`` along that direction, which swamps every
layer norm after it: a pruned copy answers one class whatever the input, and recovery cannot undo an
offset that large in a few steps.
"""

from __future__ import annotations

from pathlib import Path

import torch

from cahp_engine.data import LabelledTexts, encode
from cahp_engine.recovery import TrainingRecipe, finetune
from tests.support.tiny_models import make_classifier, make_texts, make_tokenizer


def write_fragile_model(directory: Path, *, train_rows: int = 150, train_seed: int = 1, big: float = 100.0,
                        layers: int = 3, heads: int = 4) -> Path:
    """Fine-tune a tiny BERT on ``make_texts(train_rows, seed=train_seed)``, make its heads cancel, save it."""
    texts, labels = make_texts(train_rows, num_classes=3, seed=train_seed)
    train = encode(make_tokenizer(), LabelledTexts(tuple(texts), labels, ("0", "1", "2")), max_length=32)
    model = make_classifier("bert", layers=layers, heads=heads, num_labels=3, seed=2)
    finetune(model, train, TrainingRecipe(epochs=6, lr=2e-3, batch_size=16, warmup_ratio=0.1, weight_decay=0.01,
                                          max_grad_norm=1.0, seed=0))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for layer in model.bert.encoder.layer:
            value, output = layer.attention.self.value, layer.attention.output.dense
            size = value.out_features // heads
            direction = torch.randn(output.out_features, generator=generator)
            direction /= direction.norm()
            weights = [big] * (heads - 1) + [-(heads - 1) * big]
            for h, weight in enumerate(weights):
                r = h * size + size - 1  # the last value dimension of head h
                value.weight[r].zero_()
                value.bias[r] = 1.0
                output.weight[:, r] = weight * direction
    model.save_pretrained(directory)
    make_tokenizer().save_pretrained(directory)
    return directory
