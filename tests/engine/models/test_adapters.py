import pytest
import torch
import transformers as tf

from cahp_engine.errors import UnsupportedModelError
from cahp_engine.models import SUPPORTED_FAMILIES, gate_heads, get_adapter, heads_per_layer
from tests.support.tiny_models import FAMILIES, make_classifier


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_exposes_its_heads(family):
    model = make_classifier(family, layers=3, heads=4)
    adapter = get_adapter(model)
    assert adapter.family == family
    assert heads_per_layer(model) == [4, 4, 4]
    parts = adapter.attention(adapter.layers(model)[0])
    width = 4 * adapter.head_dim(model.config)
    assert parts.output.in_features == width
    assert [p.out_features for p in parts.projections] == [width * parts.blocks] * len(parts.projections)


def test_unsupported_family_names_the_supported_ones():
    model = tf.GPT2ForSequenceClassification(tf.GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=10))
    with pytest.raises(UnsupportedModelError, match="'gpt2' is not supported.*model types bert, roberta") as caught:
        get_adapter(model)
    for model_type in ("camembert", "deberta-v2", "modernbert", "distilbert"):
        assert model_type in str(caught.value)
    assert set(SUPPORTED_FAMILIES) == set(FAMILIES)


def test_gate_hooks_are_removed_after_the_context():
    model = make_classifier("bert", layers=2, heads=4)
    ids = torch.randint(5, 30, (2, 6))
    plain = model(input_ids=ids).logits
    with torch.no_grad(), gate_heads(model, [torch.zeros(4), torch.zeros(4)]):
        gated = model(input_ids=ids).logits
    assert not torch.allclose(plain, gated)
    torch.testing.assert_close(model(input_ids=ids).logits, plain)
    with pytest.raises(ValueError, match="expected 2 gate vectors"):
        with gate_heads(model, [torch.ones(4)]):
            pass
