"""A small model, batch and head map for the tests of head surgery: three layers of four heads, wide
weights so every head matters, and padded batches on either side."""

from __future__ import annotations

import torch

from tests.support.tiny_models import make_classifier, make_tokenizer

LAYERS, HEADS, HEAD_DIM = 3, 4, 8
HIDDEN = HEADS * HEAD_DIM
TEXTS = ["good movie", "the plot was very boring and not fun at all", "fun", "a weak story but strong actor"]
# Layer 1 loses every head: the zero-head path is part of the main equivalence test.
KEPT = {0: [1, 3], 1: [], 2: [0, 2, 3]}


def padded_batch(padding_side: str) -> dict[str, torch.Tensor]:
    tokenizer = make_tokenizer()
    tokenizer.padding_side = padding_side
    encoded = tokenizer(TEXTS, padding=True, return_tensors="pt")
    assert (encoded["attention_mask"] == 0).any()  # the batch really is padded
    return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}


def gates(kept: list[tuple[int, ...]] | dict[int, list[int]]) -> list[torch.Tensor]:
    layers = dict(enumerate(kept)) if isinstance(kept, list) else kept
    return [torch.tensor([1.0 if h in layers.get(layer, range(HEADS)) else 0.0 for h in range(HEADS)])
            for layer in range(LAYERS)]


def spread_model(family: str, **overrides: object) -> torch.nn.Module:
    model = make_classifier(family, layers=LAYERS, heads=HEADS, head_dim=HEAD_DIM, **overrides)
    # The default init (std 0.02) gives nearly constant logits; wider weights make every head matter.
    # Biases are drawn too (they start at zero), so a bias entry kept for the wrong head shows.
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() == 2 or name.endswith(".bias"):
                parameter.normal_(0.0, 0.2, generator=generator)
    return model
