import copy

import numpy as np
import pytest
import torch

from cahp_engine.data import LabelledTexts, collate, encode, iterate_batches, length_grouped_batches
from cahp_engine.models import gate_heads, get_adapter
from cahp_engine.selection import gradient_salience, minmax
from tests.support.tiny_models import FAMILIES, make_classifier, make_texts, make_tokenizer


def _data(n=24, num_classes=3, seed=0):
    texts, labels = make_texts(n, num_classes=num_classes, seed=seed)
    return encode(make_tokenizer(), LabelledTexts(tuple(texts), labels, tuple("abc"[:num_classes])), max_length=32)


@pytest.mark.parametrize("family", FAMILIES)
def test_gate_at_zero_equals_removing_that_heads_output(family):
    model = make_classifier(family, layers=2, heads=4)
    data = _data()
    batch = collate(data, np.arange(8))
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    layer, head = 1, 2
    gates = [torch.ones(4), torch.ones(4)]
    gates[layer][head] = 0.0
    with torch.no_grad(), gate_heads(model, gates):
        gated = model(**inputs).logits
    removed = copy.deepcopy(model)
    adapter = get_adapter(removed)
    d = adapter.head_dim(removed.config)
    out = adapter.attention(adapter.layers(removed)[layer]).output
    with torch.no_grad():
        out.weight[:, head * d:(head + 1) * d] = 0.0
        expected = removed(**inputs).logits
        plain = model(**inputs).logits
    torch.testing.assert_close(gated, expected, rtol=0, atol=1e-6)
    assert not torch.allclose(plain, expected)


@pytest.mark.parametrize("family", ["bert", "deberta-v2", "modernbert"])
def test_salience_matches_a_finite_difference_of_the_loss(family):
    model = make_classifier(family, layers=2, heads=4).double()  # float64: the differences are tiny
    data = _data()
    batch = collate(data, np.arange(12))
    sal = gradient_salience(model, [batch])
    assert sal.shape == (2, 4) and sal.dtype == torch.float64
    eps = 1e-3
    for layer, head in [(0, 1), (1, 3)]:
        losses = []
        for sign in (1, -1):
            gates = [torch.ones(4, dtype=torch.float64) for _ in range(2)]
            gates[layer][head] += sign * eps
            with torch.no_grad(), gate_heads(model, gates):
                # The loss from the float64 logits: DeBERTa computes its own in float32.
                logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
                losses.append(float(torch.nn.functional.cross_entropy(logits, batch["labels"])))
        fd = abs(losses[0] - losses[1]) / (2 * eps)
        assert float(sal[layer, head]) == pytest.approx(fd, rel=1e-4, abs=1e-9)


def test_salience_leaves_weights_mode_and_grad_flags_unchanged():
    model = make_classifier("distilbert", layers=2, heads=4)
    model.train()
    model.classifier.weight.requires_grad_(False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    flags = {k: p.requires_grad for k, p in model.named_parameters()}
    data = _data(40)
    batches = length_grouped_batches(data.lengths, np.arange(len(data)), 8)
    sal = gradient_salience(model, iterate_batches(data, batches))
    assert torch.isfinite(sal).all() and (sal >= 0).all() and sal.sum() > 0
    assert model.training
    assert {k: p.requires_grad for k, p in model.named_parameters()} == flags
    assert all(p.grad is None for p in model.parameters())
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)


def test_minmax():
    x = torch.tensor([[2.0, 4.0], [3.0, 6.0]])
    torch.testing.assert_close(minmax(x), torch.tensor([[0.0, 0.5], [0.25, 1.0]]))
    assert minmax(torch.ones(2, 2)).sum() == 0
