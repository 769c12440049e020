"""Recovery that keeps accuracy: distillation from the dense model, per-class recall, the budget's settings.

Real transformers models (tiny, random), real fine-tuning and real pruning. The accuracy budget's
search and the recovery that keeps its best are in ``test_budget.py`` and ``test_early_stopping.py``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cahp_engine.config import PruningConfig
from cahp_engine.data import LabelledTexts
from cahp_engine.errors import ConfigError
from cahp_engine.recovery import (
    ClassificationMetrics,
    Distillation,
    TrainingRecipe,
    ValidationWatch,
    classification_metrics,
    distillation_loss,
    finetune,
    teacher_logits,
)
from cahp_engine.run import RunRequest, carve, run_pruning
from cahp_engine.run import _steps as steps
from tests.support.recovery import FAST, encoded_texts, write_three_class_dataset
from tests.support.tiny_models import make_classifier, make_texts, make_tokenizer

RECIPE = TrainingRecipe(epochs=1, lr=5e-4, batch_size=16, warmup_ratio=0.1, weight_decay=0.01, max_grad_norm=1.0,
                        seed=3)
# --------------------------------------------------------------------------- the loss


def test_distillation_loss_matches_a_hand_computed_value():
    student = torch.tensor([[2.0, 0.5, -1.0], [0.0, 1.0, 0.3]])
    teacher = torch.tensor([[1.0, 1.5, -0.5], [0.2, -0.4, 2.0]])
    labels = torch.tensor([0, 2])
    alpha, t = 0.3, 2.5

    def softmax(z):
        e = np.exp(z - z.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    s, te = student.numpy().astype(np.float64), teacher.numpy().astype(np.float64)
    ce = -np.mean(np.log(softmax(s)[np.arange(2), labels.numpy()]))
    p_t, p_s = softmax(te / t), softmax(s / t)
    kl = np.mean(np.sum(p_t * (np.log(p_t) - np.log(p_s)), axis=1))
    expected = alpha * ce + (1 - alpha) * t * t * kl
    got = float(distillation_loss(student, teacher, labels, alpha=alpha, temperature=t))
    assert got == pytest.approx(expected, rel=1e-6)
    # alpha = 1 is plain cross-entropy; a student equal to its teacher has no soft loss.
    assert float(distillation_loss(student, teacher, labels, alpha=1.0, temperature=t)) == pytest.approx(
        float(F.cross_entropy(student, labels)))
    assert float(distillation_loss(teacher, teacher, labels, alpha=0.0, temperature=t)) == pytest.approx(0.0, abs=1e-7)


def test_teacher_logits_take_one_pass_and_training_never_calls_the_teacher():
    data = encoded_texts(64)
    dense = make_classifier("bert", layers=2, heads=4, seed=4)
    calls = []
    dense.register_forward_hook(lambda *_: calls.append(1))
    teacher = teacher_logits(dense, data, batch_size=16)
    assert len(calls) == 4 and teacher.record.passes == 1 and teacher.record.rows == 64
    assert teacher.logits.shape == (64, 3) and teacher.logits.dtype == np.float32
    # Row i is sample i's logits, whatever order the length-grouped batches ran in.
    with torch.no_grad():
        one = dense(input_ids=torch.tensor([data.input_ids[7]])).logits[0].numpy()
    np.testing.assert_allclose(teacher.logits[7], one, atol=1e-5)

    student = make_classifier("bert", layers=2, heads=4, seed=4)
    plain = make_classifier("bert", layers=2, heads=4, seed=4)
    calls.clear()
    distilled = finetune(student, data, dataclasses.replace(RECIPE, distillation=Distillation(teacher, 0.5, 4.0)))
    assert calls == []  # the teacher is an array now, not a model
    assert (distilled.loss, distilled.alpha, distilled.temperature) == ("distill", 0.5, 4.0)
    assert distilled.teacher == teacher.record
    ce = finetune(plain, data, RECIPE)
    assert (ce.loss, ce.alpha, ce.temperature, ce.teacher) == ("ce", None, None, None)
    # Same seed, same batches: only the loss differs, and so do the weights.
    assert not torch.allclose(student.classifier.weight, plain.classifier.weight)


def test_a_teacher_for_other_rows_is_refused():
    data = encoded_texts(32)
    teacher = teacher_logits(make_classifier("bert", layers=2, heads=4), encoded_texts(16), batch_size=8)
    with pytest.raises(Exception, match="teacher's logits cover 16 rows"):
        finetune(make_classifier("bert", layers=2, heads=4), data,
                 dataclasses.replace(RECIPE, distillation=Distillation(teacher)))


@pytest.mark.parametrize(("make", "message"), [
    (lambda teacher: Distillation(teacher, alpha=1.5), r"`alpha` must be a number in \[0, 1\], got 1.5"),
    (lambda teacher: Distillation(teacher, temperature=0), "`temperature` must be a number > 0, got 0"),
    (lambda _: ValidationWatch(lambda *_: None, early_stopping_patience=-1), "`early_stopping_patience`"),
    (lambda _: ValidationWatch(lambda *_: None, eval_steps=2.5), "`eval_steps` must be an integer"),
    (lambda _: dataclasses.replace(RECIPE, warmup_ratio=1.5), "`warmup_ratio`"),
    (lambda _: dataclasses.replace(RECIPE, batch_size=0), "`batch_size`"),
])
def test_a_fine_tunings_records_refuse_what_would_make_it_meaningless(make, message):
    teacher = teacher_logits(make_classifier("bert", layers=2, heads=4), encoded_texts(16), batch_size=8)
    with pytest.raises(ConfigError, match=message):
        make(teacher)


# --------------------------------------------------------------------------- per-class recall


def test_recall_per_class_and_the_warnings_for_lost_classes():
    m = classification_metrics(np.array([0, 0, 1, 1, 2, 2]), np.array([0, 1, 1, 1, 0, 0]), 4)
    assert m.recall == (0.5, 1.0, 0.0, None)  # class 3 has no samples
    dense = ClassificationMetrics(accuracy=0.9, macro_f1=0.9, n=10, recall=(0.9, 0.8, 0.7))
    pruned = ClassificationMetrics(accuracy=0.5, macro_f1=0.4, n=10, recall=(0.85, 0.55, 0.0))
    warnings = steps.recall_warnings(dense, pruned, ("neg", "neu", "pos"))
    assert len(warnings) == 2
    assert "'neu'" in warnings[0] and "80.0% to 55.0%" in warnings[0]
    assert "'pos' is lost" in warnings[1]
    # 20 points exactly is not more than 20 points.
    assert steps.recall_warnings(dense, dataclasses.replace(pruned, recall=(0.7, 0.6, 0.5)), ("a", "b", "c")) == []


# --------------------------------------------------------------------------- settings


@pytest.mark.parametrize(("changes", "message"), [
    ({"recovery_loss": "mse"}, "`recovery_loss` must be one of"),
    ({"distill_alpha": 1.5}, "`distill_alpha`"),
    ({"distill_temperature": 0}, "`distill_temperature`"),
    ({"max_accuracy_drop": -1}, "`max_accuracy_drop`"),
    ({"budget_metric": "f1"}, "`budget_metric` must be one of"),
    ({"budget_screen_epochs": 0}, "`budget_screen_epochs`"),
    ({"max_accuracy_drop": 100.5}, r"`max_accuracy_drop` must be a number in \[0.0, 100.0\], got 100.5"),
    ({"budget_strategies": ("cahp", "nope")}, "`budget_strategies` must be a non-empty list of distinct names"),
    ({"budget_confidence": 0.4}, "`budget_confidence` must be a number in \\(0.5, 1.0\\)"),
    ({"early_stopping_patience": -1}, "`early_stopping_patience`"),
    ({"class_weight": "auto"}, "`class_weight` must be one of none, balanced"),
    ({"max_accuracy_drop": 1.0, "heads_to_keep": 4}, "set one of them"),
])
def test_bad_recovery_and_budget_settings_say_what_to_change(changes, message):
    with pytest.raises(ConfigError, match=message):
        PruningConfig(**changes)


def test_defaults_distil_and_have_no_budget():
    config = PruningConfig()
    assert (config.recovery_loss, config.distill_alpha, config.distill_temperature) == ("distill", 0.5, 4.0)
    assert config.max_accuracy_drop is None and config.budget_metric == "accuracy"
    assert config.budget_strategies == ("cahp", "salience") and config.budget_confidence is None
    assert (config.early_stopping_patience, config.eval_steps, config.class_weight) == (0, 0, "none")


def test_carving_is_stratified_seeded_and_disjoint():
    texts, labels = make_texts(100, num_classes=3, seed=0)
    data = LabelledTexts(tuple(texts), labels, ("a", "b", "c"))
    rest, held = carve(data, seed=1)
    assert len(rest) + len(held) == 100
    assert np.bincount(held.labels).tolist() == [round(0.1 * c) for c in np.bincount(labels)]
    again_rest, again = carve(data, seed=1)
    assert again.texts == held.texts and carve(data, seed=2)[1].texts != held.texts
    assert set(zip(rest.texts, rest.labels, strict=True)).isdisjoint(set(zip(held.texts, held.labels, strict=True))) \
        or len(set(texts)) < 100  # the generator may repeat a sentence; the rows themselves are disjoint


# --------------------------------------------------------------------------- whole runs


def test_a_run_on_a_base_model_whose_head_is_recreated_is_reproducible_from_its_seed(tmp_path):
    # The saved model has 2 labels and the data 3, so the head is new: it must come from the run's seed.
    model = tmp_path / "base"
    make_classifier("bert", layers=2, heads=4, num_labels=2, seed=2).save_pretrained(model)
    make_tokenizer().save_pretrained(model)
    data = write_three_class_dataset(tmp_path / "data", {"train": (90, 0), "test": (45, 1)})
    config = PruningConfig(**{**FAST, "dense_epochs": 1, "recovery_loss": "ce"})
    runs = [run_pruning(RunRequest(model_ref=str(model), dataset_ref=str(data), output_dir=tmp_path / f"out{i}",
                                   config=config)) for i in range(2)]
    dense = [r.metrics.dense.to_dict() for r in runs]
    pruned = [r.metrics.pruned.to_dict() for r in runs]
    assert dense[0] == dense[1] and pruned[0] == pruned[1]
    assert runs[0].selection.kept == runs[1].selection.kept
