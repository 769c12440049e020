"""Accuracy, parameter counts and latency on real tiny transformers models."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from sklearn.metrics import accuracy_score, f1_score
from transformers.pytorch_utils import prune_linear_layer

from cahp_engine._torch import model_inputs
from cahp_engine.data import LabelledTexts, collate, encode
from cahp_engine.errors import InvalidInputError
from cahp_engine.models import get_adapter, prune_heads
from cahp_engine.recovery import (
    TrainingRecipe,
    compare_speed,
    count_parameters,
    evaluate,
    finetune,
    measure_latency,
    random_inputs,
)
from tests.support.tiny_models import make_classifier, make_texts, make_tokenizer

ATTENTION_NAMES = {
    "bert": r"attention\.(self\.(query|key|value)|output\.dense)\.",
    "distilbert": r"attention\.(q_lin|k_lin|v_lin|out_lin)\.",
}


def _encoded(n: int, seed: int):
    texts, labels = make_texts(n, seed=seed)
    return encode(make_tokenizer(), LabelledTexts(tuple(texts), labels, ("a", "b", "c")), max_length=32)


@pytest.fixture(scope="module")
def split():
    return _encoded(120, seed=1)


def _keep_heads(model, layer_index: int, heads: list[int]) -> None:
    """Slice one layer down to ``heads`` the way structural pruning does."""
    adapter = get_adapter(model)
    d = adapter.head_dim(model.config)
    parts = adapter.attention(adapter.layers(model)[layer_index])
    rows = torch.cat([torch.arange(h * d, (h + 1) * d) for h in heads])
    for name in adapter.qkv_names:
        setattr(parts.module, name, prune_linear_layer(getattr(parts.module, name), rows, dim=0))
    output = prune_linear_layer(parts.output, rows, dim=1)
    owner = adapter.layers(model)[layer_index]
    *path, last = adapter.output_path.split(".")
    for name in path:
        owner = getattr(owner, name)
    setattr(owner, last, output)
    adapter.set_head_count(adapter.attention(adapter.layers(model)[layer_index]), len(heads), d)


@pytest.mark.parametrize("family", ["bert", "distilbert"])
def test_evaluate_agrees_with_sklearn_on_one_padded_batch(split, family):
    model = make_classifier(family, seed=0)
    # An untrained model predicts one class everywhere; a short training run spreads its
    # predictions, so the metrics have something to disagree about.
    finetune(model, _encoded(300, seed=0), TrainingRecipe(epochs=3, lr=1e-3, batch_size=16, warmup_ratio=0.1,
                                                          weight_decay=0.01, max_grad_norm=1.0, seed=0))
    model.train()
    metrics = evaluate(model, split, batch_size=7)
    assert model.training  # the caller's mode comes back

    model.eval()
    batch = collate(split, np.arange(len(split)))
    with torch.no_grad():
        pred = model(**model_inputs(model, batch)).logits.argmax(-1).numpy()
    assert len(np.unique(pred)) > 1
    assert metrics.n == len(split)
    assert metrics.accuracy == pytest.approx(accuracy_score(split.labels, pred))
    assert metrics.macro_f1 == pytest.approx(f1_score(split.labels, pred, average="macro", zero_division=0))
    confusion = np.asarray(metrics.confusion)
    assert confusion.shape == (3, 3) and confusion.sum() == len(split)
    assert np.trace(confusion) / len(split) == pytest.approx(metrics.accuracy)
    assert confusion.sum(axis=1).tolist() == np.bincount(split.labels).tolist()
    assert json.loads(json.dumps(metrics.to_dict()))["n"] == len(split)


@pytest.mark.parametrize("family", ["bert", "distilbert"])
def test_count_parameters_matches_named_projections_also_after_pruning(family):
    model = make_classifier(family, seed=0, layers=2, heads=4, head_dim=8)

    def manual() -> int:
        return sum(p.numel() for n, p in model.named_parameters() if re.search(ATTENTION_NAMES[family], n))

    counts = count_parameters(model)
    assert counts.total == sum(p.numel() for p in model.parameters())
    assert counts.attention == manual() == 2 * 4 * (32 * 32 + 32)
    assert counts.heads_per_layer == (4, 4)

    _keep_heads(model, 0, [1, 3])
    pruned = count_parameters(model)
    assert pruned.heads_per_layer == (2, 4)
    assert pruned.attention == manual()
    # Half of layer 0's q/k/v rows (and biases) and half of its output columns are gone.
    assert counts.attention - pruned.attention == 3 * (16 * 32 + 16) + 16 * 32
    assert counts.total - pruned.total == counts.attention - pruned.attention
    with torch.no_grad():  # the sliced model still runs
        model(input_ids=torch.tensor([[2, 7, 8, 3]]))


def test_measure_latency_reports_its_counts():
    model = make_classifier("bert", seed=0)
    lat = measure_latency(model, batch_size=3, seq_len=12, warmup=2, repeats=7)
    assert lat.p95_ms >= lat.p50_ms > 0
    assert lat.mean_ms > 0 and lat.throughput_per_s == pytest.approx(3 / (lat.mean_ms / 1e3))
    assert (lat.batch_size, lat.seq_len, lat.warmup, lat.repeats, lat.device) == (3, 12, 2, 7, "cpu")
    assert json.loads(json.dumps(lat.to_dict()))["repeats"] == 7
    assert not model.training


@pytest.mark.parametrize(
    ("family", "overrides", "pattern"),
    [
        ("deberta-v2", {"share_att_key": False, "pos_att_type": "p2c|c2p"},
         r"attention\.(self\.(query|key|value|pos_key|pos_query)_proj|output\.dense)\."),
        ("modernbert", {}, r"attn\.(Wqkv|Wo)\."),
    ],
)
def test_count_parameters_covers_fused_and_position_projections(family, overrides, pattern):
    model = make_classifier(family, seed=0, layers=2, heads=4, head_dim=8, **overrides)

    def manual() -> int:
        return sum(p.numel() for n, p in model.named_parameters() if re.search(pattern, n))

    assert count_parameters(model).attention == manual() > 0
    prune_heads(model, {0: [1, 3], 1: []})
    counts = count_parameters(model)
    assert counts.attention == manual() and counts.heads_per_layer == (2, 0)
    assert counts.total == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("family", ["roberta", "camembert", "data2vec-text"])
def test_random_inputs_avoid_special_ids_and_respect_positions(family):
    model = make_classifier(family, seed=0)
    inputs = random_inputs(model, 4, 64, seed=0, dev=torch.device("cpu"))
    assert inputs["input_ids"].shape == (4, 64)
    config = model.config
    special = torch.tensor([config.pad_token_id, config.bos_token_id, config.eos_token_id])
    assert not torch.isin(inputs["input_ids"], special).any()
    assert inputs["input_ids"].max() < config.vocab_size
    assert inputs["attention_mask"].all()
    # RoBERTa positions start after the padding index, so 130 slots hold 129 tokens.
    measure_latency(model, batch_size=1, seq_len=129, warmup=0, repeats=1)
    with pytest.raises(InvalidInputError, match="`seq_len` must be at most 129"):
        measure_latency(model, batch_size=1, seq_len=130, warmup=0, repeats=1)


def test_compare_speed_pairs_dense_and_pruned():
    dense = make_classifier("distilbert", seed=0)
    pruned = make_classifier("distilbert", seed=0)
    for layer in range(2):
        _keep_heads(pruned, layer, [0])
    speed = compare_speed(dense, pruned, batch_sizes=(1, 4), seq_len=16, warmup=1, repeats=4)
    assert [row.batch_size for row in speed.results] == [1, 4]
    for row in speed.results:
        assert row.dense.repeats == row.pruned.repeats == 4
        assert row.dense.batch_size == row.pruned.batch_size == row.batch_size
        assert row.speedup == pytest.approx(row.dense.p50_ms / row.pruned.p50_ms)
    assert (speed.seq_len, speed.warmup, speed.repeats, speed.device) == (16, 1, 4, "cpu")
    assert speed.speedup_at(4) == speed.results[1].speedup and speed.speedup_at(32) == speed.results[0].speedup
    as_json = json.loads(json.dumps(speed.to_dict()))
    assert list(as_json) == ["device", "seq_len", "warmup", "repeats", "results"]
    assert list(as_json["results"][0]) == ["batch_size", "dense", "pruned", "speedup", "speedup_low", "speedup_high"]
    assert type(speed).from_dict(as_json) == speed
    # Each speed-up comes with its 95 % interval over the paired rounds, and each latency with its spread.
    for row in speed.results:
        assert row.speedup_low is not None and row.speedup_high is not None
        assert row.speedup_low <= row.speedup_high
        for latency in (row.dense, row.pruned):
            assert latency.p25_ms is not None and latency.p75_ms is not None
            assert latency.p25_ms <= latency.p50_ms <= latency.p75_ms
    other = make_classifier("distilbert", seed=0)
    other.resize_token_embeddings(50)
    with pytest.raises(InvalidInputError, match="different vocabularies"):
        compare_speed(dense, other, repeats=1)
