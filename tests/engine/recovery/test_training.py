"""Fine-tuning on real tiny transformers models and a learnable toy task."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from cahp_engine._torch import model_inputs
from cahp_engine.data import LabelledTexts, collate, encode
from cahp_engine.errors import ConfigError, DatasetError, JobCancelledError, PipelineError
from cahp_engine.recovery import FineTuningHooks, TrainingRecipe, evaluate, finetune
from cahp_engine.recovery._recipe import param_groups as _param_groups
from tests.support.tiny_models import FAMILIES, make_classifier, make_texts, make_tokenizer

RECIPE = TrainingRecipe(epochs=1, lr=1e-3, batch_size=16, warmup_ratio=0.1, weight_decay=0.01, max_grad_norm=1.0,
                        seed=0)


def _recipe(epochs: float, **changes) -> TrainingRecipe:
    return dataclasses.replace(RECIPE, epochs=epochs, **changes)


def _encoded(n: int, seed: int):
    texts, labels = make_texts(n, seed=seed)
    return encode(make_tokenizer(), LabelledTexts(tuple(texts), labels, ("a", "b", "c")), max_length=32)


@pytest.fixture(scope="module")
def train():
    return _encoded(240, seed=0)  # 15 batches of 16


@pytest.fixture(scope="module")
def test_split():
    return _encoded(120, seed=1)


def test_finetune_learns_the_task(train, test_split):
    model = make_classifier("bert", seed=0)
    before = evaluate(model, test_split).accuracy
    result = finetune(model, train, _recipe(4))
    after = evaluate(model, test_split).accuracy
    assert before < 0.5
    assert after > 0.75
    assert result.steps == 4 * 15 and result.epochs == 4.0
    assert len(result.loss_per_epoch) == len(result.seconds_per_epoch) == 4
    assert result.loss_per_epoch[-1] < result.loss_per_epoch[0]
    assert result.device == "cpu" and result.precision == "fp32"
    assert json.loads(json.dumps(result.to_dict()))["steps"] == 60
    assert not model.training


def test_same_seed_gives_identical_weights_and_keeps_global_rng(train):
    states = []
    for _ in range(2):
        model = make_classifier("bert", seed=0)
        rng_before = torch.get_rng_state()
        finetune(model, train, RECIPE)
        assert torch.equal(torch.get_rng_state(), rng_before)
        states.append(model.state_dict())
    for name, value in states[0].items():
        assert torch.equal(value, states[1][name]), name
    other = make_classifier("bert", seed=0)
    finetune(other, train, _recipe(1, seed=1))
    assert not torch.equal(other.classifier.weight, states[0]["classifier.weight"])


def test_cancellation_stops_before_a_step_and_restores_the_model(train):
    model = make_classifier("bert", seed=0)
    model.bert.embeddings.word_embeddings.weight.requires_grad_(False)
    asked, seen = [], []

    def should_cancel() -> bool:
        asked.append(True)
        return len(asked) > 3

    with pytest.raises(JobCancelledError, match="after 3 of 30 steps"):
        finetune(model, train, _recipe(2),
                 hooks=FineTuningHooks(progress=lambda s, t: seen.append((s, t)), should_cancel=should_cancel))
    assert seen == [(1, 30), (2, 30), (3, 30)]
    assert not model.training
    assert not model.bert.embeddings.word_embeddings.weight.requires_grad
    assert all(p.requires_grad for n, p in model.named_parameters() if "word_embeddings" not in n)
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize(("epochs", "steps", "epoch_entries"), [(0.25, 4, 1), (1.5, 23, 2)])
def test_fractional_epochs_and_progress_total(train, epochs, steps, epoch_entries):
    model = make_classifier("bert", seed=0)
    seen = []
    result = finetune(model, train, _recipe(epochs), hooks=FineTuningHooks(progress=lambda s, t: seen.append((s, t))))
    assert seen == [(i, steps) for i in range(1, steps + 1)]
    assert result.steps == steps
    assert result.epochs == pytest.approx(steps / 15)
    assert len(result.loss_per_epoch) == epoch_entries


def test_zero_epochs_does_nothing(train):
    model = make_classifier("bert", seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    calls = []
    result = finetune(model, train, _recipe(0), hooks=FineTuningHooks(
        progress=lambda s, t: calls.append(s), should_cancel=lambda: calls.append(-1) or False))
    assert result.steps == 0 and result.loss_per_epoch == () and calls == []
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name


def test_non_finite_loss_raises_pipeline_error(train):
    model = make_classifier("bert", seed=0)
    with torch.no_grad():
        model.classifier.weight[0, 0] = float("inf")
    with pytest.raises(PipelineError, match="lower the learning rate"):
        finetune(model, train, RECIPE)
    assert not model.training


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_trains_a_few_steps(train, family):
    # DistilBERT takes no token_type_ids; the others take them from the BERT tokenizer.
    model = make_classifier(family, seed=0)
    before = next(p for n, p in model.named_parameters() if "classifier" in n).clone()
    result = finetune(model, train, _recipe(0.2))
    after = next(p for n, p in model.named_parameters() if "classifier" in n)
    assert result.steps == 3
    assert all(np.isfinite(result.loss_per_epoch))
    assert not torch.equal(before, after)


def test_weight_decay_skips_biases_and_layer_norms():
    model = make_classifier("distilbert", seed=0)
    decay, no_decay = (group["params"] for group in _param_groups(model, 0.01))
    names = {id(p): n for n, p in model.named_parameters()}
    assert len(decay) + len(no_decay) == len(names)

    def is_norm(name: str) -> bool:
        return "layer_norm" in name or "LayerNorm" in name

    assert all(names[id(p)].endswith("weight") and not is_norm(names[id(p)]) for p in decay)
    assert all(names[id(p)].endswith("bias") or is_norm(names[id(p)]) for p in no_decay)
    # Both spellings occur in DistilBERT: embeddings.LayerNorm and the layers' *_layer_norm.
    assert any("embeddings.LayerNorm.weight" in names[id(p)] for p in no_decay)
    assert any("output_layer_norm.weight" in names[id(p)] for p in no_decay)


def test_invalid_recipe_and_label_mismatch(train):
    with pytest.raises(ConfigError, match="`epochs` must be a number >= 0"):
        _recipe(-1)
    with pytest.raises(ConfigError, match="`lr`"):
        _recipe(1, lr=0.0)
    two_labels = make_classifier("bert", seed=0, num_labels=2)
    with pytest.raises(DatasetError, match="2 outputs"):
        finetune(two_labels, train, RECIPE)


def test_an_auxiliary_loss_sees_the_hidden_states_and_is_added_to_each_step(train):
    seen: list[int] = []

    def pull_to_zero(outputs, batch):
        seen.append(len(outputs.hidden_states))  # embeddings + one per layer
        assert batch["input_ids"].shape[0] == outputs.logits.shape[0]
        return 10.0 * outputs.hidden_states[-1].pow(2).mean()

    plain, pulled = make_classifier("bert", seed=0), make_classifier("bert", seed=0)
    base = finetune(plain, train, RECIPE)
    result = finetune(pulled, train, _recipe(1, auxiliary_loss=pull_to_zero))
    assert seen == [plain.config.num_hidden_layers + 1] * result.steps == [3] * 15
    assert result.loss_per_epoch[0] > base.loss_per_epoch[0]  # the term is in the loss...
    inputs = model_inputs(plain, collate(train, np.arange(16)))
    with torch.no_grad():  # ...and in the gradients: the last layer's states were pulled towards zero
        last = [m(**inputs, output_hidden_states=True).hidden_states[-1].pow(2).mean() for m in (plain, pulled)]
    assert last[1] < last[0]
