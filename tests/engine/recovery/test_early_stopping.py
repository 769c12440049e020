"""Recovery that keeps its best: evaluations on a validation split, the best weights, early stopping,
a fine-tuning paused and resumed, and class-balanced losses; on real tiny transformers models."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cahp_engine.data import LabelledTexts, encode
from cahp_engine.recovery import (
    FineTuning,
    FineTuningHooks,
    TrainingRecipe,
    ValidationWatch,
    balanced_class_weights,
    classification_metrics,
    distillation_loss,
    evaluate,
    finetune,
    predict,
)
from cahp_engine.results import ValidationPoint
from tests.support.tiny_models import make_classifier, make_texts, make_tokenizer

RECIPE = TrainingRecipe(epochs=1, lr=2e-3, batch_size=16, warmup_ratio=0.1, weight_decay=0.01, max_grad_norm=1.0,
                        seed=3)


def _recipe(epochs: float, lr: float, **changes) -> TrainingRecipe:
    return dataclasses.replace(RECIPE, epochs=epochs, lr=lr, **changes)


def _encoded(n: int, seed: int, num_classes: int = 3):
    texts, labels = make_texts(n, num_classes=num_classes, seed=seed)
    names = tuple("abcde"[:num_classes])
    return encode(make_tokenizer(), LabelledTexts(tuple(texts), labels, names), max_length=32)


@pytest.fixture(scope="module")
def train():
    return _encoded(160, seed=0)  # 10 batches of 16


@pytest.fixture(scope="module")
def validation():
    return _encoded(60, seed=2)


@pytest.fixture(scope="module")
def trained(train):
    """A model that has learnt the task: recovery at a wrecking rate can only lower its score."""
    model = make_classifier("bert", layers=2, heads=4, seed=1)
    finetune(model, train, _recipe(8, 2e-3))
    return model


def _scorer(data):
    def validate(model, step, epoch):
        m = classification_metrics(data.labels, predict(model, data, batch_size=32), data.num_classes)
        return ValidationPoint(step=step, epoch=epoch, score=m.accuracy, accuracy=m.accuracy, macro_f1=m.macro_f1)
    return validate


def _same_weights(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_recovery_never_returns_weights_worse_on_validation_than_its_start(trained, train, validation):
    start = evaluate(trained, validation).accuracy
    assert start > 0.7  # the model has learnt the task
    model = copy.deepcopy(trained)
    # AdamW at lr 0.05 moves every weight by about the rate each step: training wrecks the model.
    result = finetune(model, train, _recipe(2, 0.05), watch=ValidationWatch(_scorer(validation)))
    scores = [p.score for p in result.validation]
    assert [p.step for p in result.validation] == [0, 10, 20] and scores[0] == pytest.approx(start)
    assert max(scores[1:]) < start  # every epoch made it worse ...
    assert result.best_step == 0 and result.best_epoch == 0.0  # ... so the start is handed back,
    assert _same_weights(model, trained)  # weight for weight,
    assert evaluate(model, validation).accuracy == pytest.approx(start)
    assert result.steps == 20 and not result.stopped_early and result.early_stopping_patience == 0

    plain = copy.deepcopy(trained)
    finetune(plain, train, _recipe(2, 0.05))  # without a validation split: the last weights
    assert evaluate(plain, validation).accuracy < start


def test_the_best_evaluation_is_kept_when_training_helps(train, validation):
    model = make_classifier("bert", layers=2, heads=4, seed=5)
    result = finetune(model, train, _recipe(3, 2e-3), watch=ValidationWatch(_scorer(validation)))
    best = max(result.validation, key=lambda p: p.score)
    assert result.best_step == next(p.step for p in result.validation if p.score == best.score)  # the first best
    assert best.score > result.validation[0].score
    assert evaluate(model, validation).accuracy == pytest.approx(best.score)


def test_early_stopping_stops_after_patience_evaluations_without_gain(trained, train, validation):
    stopped = finetune(copy.deepcopy(trained), train, _recipe(4, 0.05),
                       watch=ValidationWatch(_scorer(validation), early_stopping_patience=1))
    assert stopped.stopped_early and stopped.early_stopping_patience == 1
    assert stopped.steps == 10 and len(stopped.validation) == 2  # epoch 1 brought no gain: no epoch 2
    assert len(stopped.loss_per_epoch) == 1
    two = finetune(copy.deepcopy(trained), train, _recipe(4, 0.05),
                   watch=ValidationWatch(_scorer(validation), early_stopping_patience=2))
    assert two.stopped_early and two.steps == 20 and len(two.validation) == 3
    full = finetune(copy.deepcopy(trained), train, _recipe(4, 0.05), watch=ValidationWatch(_scorer(validation)))
    assert not full.stopped_early and full.steps == 40


def test_evaluations_every_n_steps_and_after_the_last(train, validation):
    model = make_classifier("bert", layers=2, heads=4, seed=5)
    result = finetune(model, train, _recipe(2.5, 2e-3), watch=ValidationWatch(_scorer(validation), eval_steps=7))
    assert [p.step for p in result.validation] == [0, 7, 14, 21, 25]
    assert [p.epoch for p in result.validation] == pytest.approx([0, 0.7, 1.4, 2.1, 2.5])


def test_a_paused_and_resumed_fine_tuning_ends_as_an_uninterrupted_one(train, validation):
    recipe, watch = _recipe(3, 2e-3), ValidationWatch(_scorer(validation), eval_steps=4)
    straight = make_classifier("bert", layers=2, heads=4, seed=5)
    expected = finetune(straight, train, recipe, watch=watch)

    # Two fine-tunings advanced in turn (the budget's candidates) share one process's random state.
    first, other = make_classifier("bert", layers=2, heads=4, seed=5), make_classifier("bert", layers=2, heads=4)
    a = FineTuning(first, train, recipe, watch=watch)
    b = FineTuning(other, train, dataclasses.replace(recipe, seed=9), watch=watch)
    for _ in range(3):
        a.advance()
        b.advance()
        torch.rand(5)  # the caller's own draws between two pieces of work
    # ... and the rest in another FineTuning built from the saved state of the first.
    resumed_model = make_classifier("bert", layers=2, heads=4, seed=0)
    resumed = FineTuning(resumed_model, train, recipe, watch=watch)
    saved = copy.deepcopy(a.state_dict())
    resumed.load_state_dict(copy.deepcopy(saved))
    while not resumed.done:
        resumed.advance()
    got = resumed.finish()
    assert _same_weights(resumed_model, straight)
    assert got.validation == expected.validation and got.loss_per_epoch == pytest.approx(expected.loss_per_epoch)
    assert (got.steps, got.best_step) == (expected.steps, expected.best_step)
    # The same through the hooks: the saved state given as `resume`, and a call when built and at every stop.
    again, stops = make_classifier("bert", layers=2, heads=4, seed=0), []
    finetune(again, train, recipe, watch=watch,
             hooks=FineTuningHooks(resume=saved, on_stop=lambda tuning: stops.append(tuning.step)))
    assert _same_weights(again, straight) and stops == [8, 12, 16, 20, 24, 28, 30]


def test_balanced_class_weights_follow_scikit_learns_rule():
    weights = balanced_class_weights(np.array([0, 0, 0, 0, 0, 0, 1, 1, 2]), 4)
    assert weights.tolist() == pytest.approx([9 / (3 * 6), 9 / (3 * 2), 9 / (3 * 1), 1.0])


def test_class_weights_weigh_both_terms_of_the_loss_by_the_label():
    student = torch.tensor([[2.0, 0.5, -1.0], [0.0, 1.0, 0.3], [0.5, 0.5, 0.5]])
    teacher = torch.tensor([[1.0, 1.5, -0.5], [0.2, -0.4, 2.0], [1.0, 0.0, 0.0]])
    labels = torch.tensor([0, 2, 2])
    w = torch.tensor([3.0, 1.0, 0.5])
    alpha, t = 0.3, 2.0
    rows = w[labels]
    ce = (F.cross_entropy(student, labels, reduction="none") * rows).sum() / rows.sum()
    kl = F.kl_div(F.log_softmax(student / t, -1), F.log_softmax(teacher / t, -1), reduction="none",
                  log_target=True).sum(-1)
    expected = alpha * ce + (1 - alpha) * t * t * (kl * rows).sum() / rows.sum()
    got = distillation_loss(student, teacher, labels, alpha=alpha, temperature=t, class_weights=w)
    assert float(got) == pytest.approx(float(expected), rel=1e-6)
    # Equal weights are the unweighted loss.
    assert float(distillation_loss(student, teacher, labels, alpha=alpha, temperature=t,
                                   class_weights=torch.ones(3))) == pytest.approx(
        float(distillation_loss(student, teacher, labels, alpha=alpha, temperature=t)), rel=1e-6)


def test_class_balanced_recovery_trains_with_the_weights_and_records_them():
    # Class 2 is 1 row in 16: balanced weights make its rows count as much as a common class's.
    texts, labels = make_texts(480, num_classes=3, seed=0)
    keep = np.flatnonzero(labels != 2)[:150].tolist() + np.flatnonzero(labels == 2)[:10].tolist()
    data = encode(make_tokenizer(), LabelledTexts(tuple(texts[i] for i in keep), labels[keep], ("a", "b", "c")),
                  max_length=32)
    weights = balanced_class_weights(data.labels, 3)
    weighted, plain = make_classifier("bert", layers=2, heads=4, seed=1), make_classifier("bert", layers=2, heads=4,
                                                                                         seed=1)
    result = finetune(weighted, data, _recipe(2, 2e-3, class_weights=weights))
    assert result.class_weights == pytest.approx(weights.tolist()) and result.class_weights[2] > 5
    finetune(plain, data, _recipe(2, 2e-3))
    # The rare class pulls harder: the probability the model gives it, over the data, is higher.
    assert _mean_probability(weighted, data, 2) > _mean_probability(plain, data, 2) + 0.05


def _mean_probability(model, data, label: int) -> float:
    from cahp_engine.data import collate

    with torch.no_grad():
        logits = model(**{k: v for k, v in collate(data, np.arange(len(data))).items() if k != "labels"}).logits
    return float(torch.softmax(logits, -1)[:, label].mean())


def test_an_early_stopped_fine_tuning_is_the_never_stopped_ones_prefix(train, validation):
    """Early stopping changes where a fine-tuning ends, not its path: the schedule is planned for every
    epoch either way and validation takes nothing from the training's random state. What lets a study
    read every patience off one never-stopped run."""
    scores = iter([0.2, 0.6, 0.4, 0.3, 0.1])  # a curve that peaks after the first epoch

    def scorer(model, step, epoch):
        s = next(scores)
        return ValidationPoint(step=step, epoch=epoch, score=s, accuracy=s, macro_f1=s)

    recipe = _recipe(4, 2e-3)
    never = FineTuning(make_classifier("bert", layers=2, heads=4, seed=5), train, recipe,
                       watch=ValidationWatch(_scorer(validation)))
    snapshots = {}
    while not never.done:
        never.advance()
        evaluate(never.model, validation)  # another split scored between two stops, as the study does
        snapshots[never.step] = copy.deepcopy(never.model)
    plain = make_classifier("bert", layers=2, heads=4, seed=5)
    finetune(plain, train, recipe)  # no validation at all: the never-stopped run's last weights
    assert _same_weights(plain, snapshots[40])

    stopped_model = make_classifier("bert", layers=2, heads=4, seed=5)
    stopped = finetune(stopped_model, train, recipe, watch=ValidationWatch(scorer, early_stopping_patience=1))
    assert stopped.stopped_early and stopped.steps == 20 and stopped.best_step == 10
    assert _same_weights(stopped_model, snapshots[10])  # the best weights, taken on the same path
