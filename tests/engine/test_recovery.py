"""Recovery that keeps accuracy: distillation from the dense model, per-class recall, the accuracy budget.

Real transformers models (tiny, random), real fine-tuning and real pruning; nothing is stubbed but the
guard that makes reading the evaluation split fail during the budget search.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cahp_engine.config import PruningConfig
from cahp_engine.data import LabelledTexts, encode
from cahp_engine.errors import AccuracyBudgetError, ConfigError
from cahp_engine.recovery import classification_metrics, distillation_loss, finetune, teacher_logits
from cahp_engine.results import ClassificationMetrics
from cahp_engine.run import RunReport, carve, run_pruning
from cahp_engine.run import _steps as steps
from tests.support.tiny_models import make_classifier, make_texts, make_tokenizer

RECIPE = {"lr": 5e-4, "batch_size": 16, "warmup_ratio": 0.1, "weight_decay": 0.01, "max_grad_norm": 1.0, "seed": 3}
#: A small, fast run whose dense model learns the task (the saved random head counts as trained,
#: so dense fine-tuning is asked for).
FAST = {"resolution": 6, "signature_samples": "all", "calibration_fraction": 1.0, "stability_shards": 0,
        "epochs": 1, "dense_finetune": "always", "dense_epochs": 4, "dense_lr": 2e-3, "lr": 5e-4, "batch_size": 16,
        "latency_warmup": 0, "latency_repeats": 1, "export": "none", "seed": 5}


def _encoded(n: int, seed: int = 0):
    texts, labels = make_texts(n, num_classes=3, seed=seed)
    return encode(make_tokenizer(), LabelledTexts(tuple(texts), labels, ("a", "b", "c")), max_length=32)


def _write_dataset(directory: Path, splits: dict[str, tuple[int, int]]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for split, (n, seed) in splits.items():
        texts, labels = make_texts(n, num_classes=3, seed=seed)
        with open(directory / f"{split}.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(("text", "label"))
            writer.writerows(zip(texts, (int(y) for y in labels), strict=True))
    return directory


def _write_model(directory: Path) -> Path:
    make_classifier("bert", layers=3, heads=4, num_labels=3, seed=2).save_pretrained(directory)
    make_tokenizer().save_pretrained(directory)
    return directory


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
    data = _encoded(64)
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
    distilled = finetune(student, data, epochs=1, teacher=teacher, alpha=0.5, temperature=4.0, **RECIPE)
    assert calls == []  # the teacher is an array now, not a model
    assert (distilled.loss, distilled.alpha, distilled.temperature) == ("distill", 0.5, 4.0)
    assert distilled.teacher == teacher.record
    ce = finetune(plain, data, epochs=1, **RECIPE)
    assert (ce.loss, ce.alpha, ce.temperature, ce.teacher) == ("ce", None, None, None)
    # Same seed, same batches: only the loss differs, and so do the weights.
    assert not torch.allclose(student.classifier.weight, plain.classifier.weight)


def test_a_teacher_for_other_rows_is_refused():
    data = _encoded(32)
    teacher = teacher_logits(make_classifier("bert", layers=2, heads=4), _encoded(16), batch_size=8)
    with pytest.raises(Exception, match="teacher's logits cover 16 rows"):
        finetune(make_classifier("bert", layers=2, heads=4), data, epochs=1, teacher=teacher, **RECIPE)


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
    ({"max_accuracy_drop": 1.0, "heads_to_keep": 4}, "set one of them"),
])
def test_bad_recovery_and_budget_settings_say_what_to_change(changes, message):
    with pytest.raises(ConfigError, match=message):
        PruningConfig(**changes)


def test_defaults_distil_and_have_no_budget():
    config = PruningConfig()
    assert (config.recovery_loss, config.distill_alpha, config.distill_temperature) == ("distill", 0.5, 4.0)
    assert config.max_accuracy_drop is None and config.budget_metric == "accuracy"


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


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return _write_model(tmp_path_factory.mktemp("model") / "m")


class _Guarded:
    """An evaluation split that fails the test when read while ``on['searching']`` is set."""

    def __init__(self, real, on):
        self._real, self._on = real, on

    def __getattr__(self, name):
        if self._on["searching"]:
            raise AssertionError(f"the budget search read the evaluation split ({name})")
        return getattr(self._real, name)

    def __len__(self):
        if self._on["searching"]:
            raise AssertionError("the budget search read the evaluation split (len)")
        return len(self._real)


@pytest.fixture
def guard_evaluation(monkeypatch):
    on = {"searching": False, "searched": 0}
    load, search = steps.load, steps.budget_search

    def guarded_load(*args, **kwargs):
        inputs = load(*args, **kwargs)
        return dataclasses.replace(inputs, evaluation=_Guarded(inputs.evaluation, on))

    def guarded_search(*args, **kwargs):
        on["searching"], on["searched"] = True, on["searched"] + 1
        try:
            return search(*args, **kwargs)
        finally:
            on["searching"] = False

    monkeypatch.setattr(steps, "load", guarded_load)
    monkeypatch.setattr(steps, "budget_search", guarded_search)
    return on


def test_a_budget_run_keeps_the_smallest_candidate_and_never_reads_the_test_split(
        tmp_path, model_dir, guard_evaluation):
    data = _write_dataset(tmp_path / "data", {"train": (150, 0), "test": (45, 1)})
    config = PruningConfig(**FAST, max_accuracy_drop=100.0, budget_screen_epochs=0.5)
    report = run_pruning(str(model_dir), str(data), tmp_path / "out", config)
    assert guard_evaluation["searched"] == 1
    budget = report.budget
    assert budget is not None and budget.carved and budget.split == "train"
    # A stratified 10 % of 150 rows of 3 balanced classes, left out of selection and training.
    assert budget.validation_rows == 15 and report.dataset.train_rows == 135
    assert report.recovery.teacher is not None and report.recovery.teacher.rows == 135
    # P = 100 points: the first candidate (fewest heads) is within budget and is the one returned.
    first = budget.candidates[0]
    assert len(budget.candidates) == 1 and first.within_budget and budget.chosen == first.heads_kept
    assert report.summary.heads_kept == first.heads_kept == report.selection.heads_kept
    assert report.selection.k_star == first.k == min(report.selection.knees_by_degree.values())
    assert first.screen_epochs == 0.5 and first.accuracy_final is not None
    assert budget.threshold == pytest.approx(budget.dense_validation - 1.0)
    assert budget.cost_vs_single_run is not None and budget.cost_vs_single_run > 1.0
    assert report.recovery.epochs == pytest.approx(1.0)
    on_disk = json.loads((tmp_path / "out" / "report.json").read_text())
    assert on_disk["budget"] == budget.to_dict() and RunReport.from_dict(on_disk).budget == budget
    assert len(on_disk["metrics"]["pruned"]["recall"]) == 3
    assert (tmp_path / "out" / "budget.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from app.cli.prune import format_summary

    text = format_summary(report, tmp_path / "out")
    assert "chosen by the accuracy budget" in text and "<- chosen" in text and "distillation (alpha 0.5, T 4)" in text


def test_a_budget_nobody_meets_fails_and_still_writes_the_report(tmp_path, model_dir, guard_evaluation):
    data = _write_dataset(tmp_path / "data", {"train": (150, 0), "validation": (30, 2), "test": (45, 1)})
    out = tmp_path / "out"
    # Zero points, judged on macro-F1 after a screening recovery at a rate that wrecks the weights
    # (AdamW moves every weight by about the rate each step): no candidate can match the dense model.
    config = PruningConfig(**{**FAST, "lr": 0.05}, max_accuracy_drop=0.0, budget_metric="macro_f1",
                           budget_screen_epochs=1.0)
    with pytest.raises(AccuracyBudgetError, match="no candidate kept validation macro_f1 within 0 points") as err:
        run_pruning(str(model_dir), str(data), out, config)
    assert err.value.code == "accuracy_budget_not_met"
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "failed" and report["error"]["code"] == "accuracy_budget_not_met"
    budget = report["budget"]
    assert budget["split"] == "validation" and not budget["carved"] and budget["validation_rows"] == 30
    assert budget["chosen"] is None and len(budget["candidates"]) >= 2
    assert not any(c["within_budget"] for c in budget["candidates"])
    kept = [c["heads_kept"] for c in budget["candidates"]]
    assert kept == sorted(kept) and len(set(kept)) == len(kept) and kept[-1] == 11  # up to N - 1 = 11 heads
    assert report["dataset"]["train_rows"] == 150  # a validation split of its own: nothing carved
    assert {p.name for p in out.iterdir()} == {"report.json", "mss_curve.json", "mss_curve.png", "head_map.json",
                                               "head_map.png", "layer_retention.png", "budget.png"}
    assert (out / "budget.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_run_on_a_base_model_whose_head_is_recreated_is_reproducible_from_its_seed(tmp_path):
    # The saved model has 2 labels and the data 3, so the head is new: it must come from the run's seed.
    model = tmp_path / "base"
    make_classifier("bert", layers=2, heads=4, num_labels=2, seed=2).save_pretrained(model)
    make_tokenizer().save_pretrained(model)
    data = _write_dataset(tmp_path / "data", {"train": (90, 0), "test": (45, 1)})
    config = PruningConfig(**{**FAST, "dense_epochs": 1, "recovery_loss": "ce"})
    runs = [run_pruning(str(model), str(data), tmp_path / f"out{i}", config) for i in range(2)]
    dense = [r.metrics.dense.to_dict() for r in runs]
    pruned = [r.metrics.pruned.to_dict() for r in runs]
    assert dense[0] == dense[1] and pruned[0] == pruned[1]
    assert runs[0].selection.kept == runs[1].selection.kept
