import numpy as np
import pytest
import torch

from cahp_engine.data import LabelledTexts, collate, encode, iterate_batches, length_grouped_batches
from cahp_engine.errors import PipelineError
from cahp_engine.models import eager_attention
from cahp_engine.selection import ClassMoments, crop_and_resize, default_resolution, extract_signatures
from tests.support.tiny_models import LAYOUTS, make_classifier, make_texts, make_tokenizer


def test_streaming_moments_equal_numpy_on_the_concatenated_data():
    rng = np.random.default_rng(1)
    c, f = 3, 17
    chunks = [rng.normal(size=(int(n), f)) * 3 + 1 for n in (5, 1, 12, 7, 30)]
    labels = [rng.integers(0, c, size=len(x)) for x in chunks]
    labels[0][:] = 0  # a batch with one class only
    acc = ClassMoments(c, f)
    for x, y in zip(chunks, labels, strict=True):
        acc.update(torch.tensor(x, dtype=torch.float32), torch.tensor(y))
    mean, var, counts = acc.finalize()
    allx = np.concatenate([x.astype(np.float32).astype(np.float64) for x in chunks])
    ally = np.concatenate(labels)
    for k in range(c):
        assert counts[k] == (ally == k).sum()
        np.testing.assert_allclose(mean[k], allx[ally == k].mean(axis=0), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(var[k], allx[ally == k].var(axis=0), rtol=1e-9, atol=1e-12)


def test_crop_and_resize_ignores_padding_on_either_side():
    torch.manual_seed(0)
    real = torch.softmax(torch.randn(1, 2, 5, 5), dim=-1)
    expected = crop_and_resize(real, torch.ones(1, 5, dtype=torch.long), 4)
    for width, left in [(8, False), (8, True), (11, False), (6, True)]:
        attn = torch.rand(1, 2, width, width)  # junk everywhere ...
        span = slice(width - 5, width) if left else slice(0, 5)
        attn[:, :, span, span] = real  # ... except on the real tokens
        mask = torch.zeros(1, width, dtype=torch.long)
        mask[:, span] = 1
        got = crop_and_resize(attn, mask, 4)
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


def _one_sentence_batch(tok, sentence, width, left):
    ids = tok(sentence)["input_ids"]
    n = len(ids)
    pad = width - n
    input_ids = torch.full((1, width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros((1, width), dtype=torch.long)
    span = slice(pad, width) if left else slice(0, n)
    input_ids[0, span] = torch.tensor(ids)
    mask[0, span] = 1
    return {"input_ids": input_ids, "attention_mask": mask, "labels": torch.tensor([0])}


@pytest.mark.parametrize("family", ["roberta", "bert", "deberta-v2", "modernbert"])
def test_same_sentence_padded_differently_gives_the_same_signature(family):
    model = make_classifier(family, layers=3, heads=4)
    tok = make_tokenizer()
    sentence = "the movie was very good but the plot was dull"
    n = len(tok(sentence)["input_ids"])
    # BERT's position ids count from the first column, so only right padding leaves it invariant;
    # RoBERTa derives positions from the non-pad tokens, and DeBERTa-v3 and ModernBERT (rotary, with
    # a local window in layer 1) see only relative positions, so left padding is tested on them.
    variants = [(n, False), (n + 3, False), (n + 9, False)]
    if family != "bert":
        variants += [(n + 4, True), (n + 1, True)]
    sigs = [
        extract_signatures(model, [_one_sentence_batch(tok, sentence, w, left)], num_classes=1, resolution=6)
        for w, left in variants
    ]
    for s in sigs[1:]:
        np.testing.assert_allclose(s.mean, sigs[0].mean, atol=2e-6)


@pytest.mark.parametrize("family", ["distilbert", "deberta-v2", "modernbert"])
def test_extraction_restores_mode_and_attention_implementation(family):
    model = make_classifier(family, layers=2, heads=4)
    tok = make_tokenizer()
    texts, labels = make_texts(20, num_classes=2)
    data = encode(tok, LabelledTexts(tuple(texts), labels, ("a", "b")), max_length=32)
    probe = {k: v for k, v in collate(data, np.arange(4)).items() if k != "labels"}
    with torch.no_grad():
        logits = model(**probe).logits
    model.train()
    before = model.config._attn_implementation
    batches = length_grouped_batches(data.lengths, np.arange(len(data)), 8)
    sig = extract_signatures(model, iterate_batches(data, batches), num_classes=2, resolution=5)
    assert model.training
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())  # none left behind
    model.eval()
    with torch.no_grad():  # the early-stopped passes left no state behind
        torch.testing.assert_close(model(**probe).logits, logits)
        with eager_attention(model):
            assert len(model(**probe, output_attentions=True).attentions) == 2
    model.train()
    assert model.config._attn_implementation == before
    assert sig.mean.shape == (2, 8, 25) and sig.counts.tolist() == [10, 10]
    # Each map is a resized row-stochastic matrix: all values positive, except where ModernBERT's
    # local layer (layer 1 of 2 here) puts exactly zero on tokens outside its window.
    full = sig.mean.reshape(2, 2, 4, 25)[:, 0 if family == "modernbert" else slice(None)]
    assert (full > 0).all() and (sig.mean >= 0).all()


def test_batching_does_not_change_the_signature():
    model = make_classifier("electra", layers=2, heads=4)
    tok = make_tokenizer()
    texts, labels = make_texts(40, num_classes=2, seed=3)
    data = encode(tok, LabelledTexts(tuple(texts), labels, ("a", "b")), max_length=32)
    idx = np.arange(len(data))
    one = extract_signatures(model, iterate_batches(data, [idx[i:i + 1] for i in idx]), num_classes=2, resolution=7)
    many = extract_signatures(model, iterate_batches(data, length_grouped_batches(data.lengths, idx, 16)),
                              num_classes=2, resolution=7)
    np.testing.assert_allclose(many.mean, one.mean, atol=1e-6)
    np.testing.assert_allclose(many.var, one.var, atol=1e-6)


def test_an_attention_implementation_without_probabilities_is_detected(monkeypatch):
    model = make_classifier("bert", layers=2, heads=4)
    assert model.config._attn_implementation == "sdpa"
    # Simulate a model whose implementation cannot be switched: sdpa returns no probabilities.
    monkeypatch.setattr(type(model), "set_attn_implementation", lambda self, impl: None)
    tok = make_tokenizer()
    batch = _one_sentence_batch(tok, "good movie", 6, False)
    with pytest.raises(PipelineError, match="no attention probabilities"):
        extract_signatures(model, [batch], num_classes=1, resolution=4)


def test_default_resolution_is_the_70th_percentile():
    lengths = np.arange(1, 101)
    assert default_resolution(lengths) == round(np.percentile(lengths, 70))
    assert default_resolution(np.array([1, 1, 1])) == 2


@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("family", LAYOUTS)
def test_signature_is_the_class_mean_of_the_cropped_resized_maps(family, padding_side):
    model = make_classifier(family, layers=3, heads=4)
    tok = make_tokenizer()
    texts, labels = make_texts(12, num_classes=2, seed=5)
    data = encode(tok, LabelledTexts(tuple(texts), labels, ("a", "b")), max_length=32)
    batch = collate(data, np.arange(len(data)), padding_side=padding_side)
    assert (batch["attention_mask"] == 0).any()
    sig = extract_signatures(model, [batch], num_classes=2, resolution=5)

    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with eager_attention(model), torch.no_grad():
        attentions = model(**inputs, output_attentions=True).attentions
    maps = torch.cat([crop_and_resize(a, batch["attention_mask"], 5) for a in attentions], dim=1).double()
    assert maps.shape == (12, 12, 25)
    for c in range(2):
        rows = maps[batch["labels"] == c]
        np.testing.assert_allclose(sig.mean[c], rows.mean(0).numpy(), atol=1e-6)
        np.testing.assert_allclose(sig.var[c], rows.var(0, unbiased=False).numpy(), atol=1e-6)
    assert ((sig.mean >= 0) & (sig.mean < 1)).all()  # resized probabilities
    if family == "modernbert":
        # Layer 1 attends within 2 tokens each side: the far corners of its maps are exactly 0,
        # the global layers' are not.
        corners = sig.mean.reshape(2, 3, 4, 5, 5)[:, :, :, [0, -1], [-1, 0]]
        assert (corners[:, 1] == 0).all() and (corners[:, [0, 2]] > 0).all()
