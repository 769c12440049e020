"""The accuracy budget's search and the recovery that keeps its best, on real tiny models and datasets:
the drop's paired bootstrap and the noise warning, a lost class, candidates as independent units of
work, bisection with successive halving, determinism, the report's fields, and an evaluation split
that neither the search nor early stopping ever reads."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from cahp_engine.config import PruningConfig
from cahp_engine.data import LabelledTexts, encode
from cahp_engine.errors import AccuracyBudgetError, DatasetError
from cahp_engine.recovery import (
    ClassificationMetrics,
    TrainingRecipe,
    classification_metrics,
    drop_interval,
    evaluate,
    finetune,
    metric_of_predictions,
    predict,
)
from cahp_engine.results import BudgetRecord
from cahp_engine.run import CandidateSpec, RunReport, RunRequest, SearchInputs, carve, recover_candidate, run_pruning
from cahp_engine.run import _steps as steps
from cahp_engine.run._budget import budget_warnings
from cahp_engine.run._holdout import ValidationScorer, seen_in_training
from tests.support.fragile import write_fragile_model
from tests.support.helpers import write_split
from tests.support.tiny_models import make_classifier, make_texts, make_tokenizer

#: A small, fast run whose dense model learns the task (dense fine-tuning asked for).
FAST = {"resolution": 6, "signature_samples": "all", "calibration_fraction": 1.0, "stability_shards": 0,
        "epochs": 2, "dense_finetune": "always", "dense_epochs": 4, "dense_lr": 2e-3, "lr": 5e-4, "batch_size": 16,
        "latency_warmup": 0, "latency_repeats": 1, "export": "none", "seed": 5}


def _dataset(directory: Path, splits: dict[str, tuple[int, int]]) -> Path:
    for split, (n, seed) in splits.items():
        write_split(directory / f"{split}.csv", n, seed=seed)
    return directory


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("model") / "m"
    make_classifier("bert", layers=3, heads=4, num_labels=3, seed=2).save_pretrained(directory)
    make_tokenizer().save_pretrained(directory)
    return directory


def _encoded(n: int, seed: int):
    texts, labels = make_texts(n, num_classes=3, seed=seed)
    return encode(make_tokenizer(), LabelledTexts(tuple(texts), labels, ("a", "b", "c")), max_length=32)


# --------------------------------------------------------------------------- the noise of a drop


def test_the_drop_interval_is_paired_seeded_and_narrows_with_more_rows():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 400)
    dense = np.where(rng.random(400) < 0.8, y, (y + 1) % 3)
    candidate = np.where(rng.random(400) < 0.1, (dense + 1) % 3, dense)  # differs from dense on ~10 % of rows
    got = drop_interval(y, dense, candidate, num_classes=3, metric="accuracy", seed=1)
    assert got.drop == pytest.approx(100 * ((dense == y).mean() - (candidate == y).mean()))
    assert got.low < got.drop < got.high and got.half_width == pytest.approx((got.high - got.low) / 2)
    assert got.resamples == 2000 and got.upper is None
    assert drop_interval(y, dense, candidate, num_classes=3, metric="accuracy", seed=1) == got  # seeded
    # Paired: the rows both models get right or wrong cancel. Unpaired, two accuracies of 400 rows
    # would give about +-2 x 1.96 x sqrt(0.8 x 0.2 / 400) x sqrt(2) = +-5.5 points; paired it is far less.
    assert got.half_width < 4.0
    # Four times the rows: about half the width.
    many = drop_interval(np.tile(y, 4), np.tile(dense, 4), np.tile(candidate, 4), num_classes=3,
                         metric="accuracy", seed=1)
    assert many.half_width == pytest.approx(got.half_width / 2, rel=0.25)
    same = drop_interval(y, dense, dense, num_classes=3, metric="macro_f1", seed=1, confidence=0.9)
    assert (same.drop, same.low, same.high, same.upper) == (0.0, 0.0, 0.0, 0.0)
    strict = drop_interval(y, dense, candidate, num_classes=3, metric="accuracy", seed=1, confidence=0.9)
    assert strict.drop < strict.upper < strict.high  # the one-sided 90 % bound lies inside the 95 % interval


def test_macro_f1_of_resampled_predictions_is_scored_as_evaluate_scores_it():
    rng = np.random.default_rng(3)
    y, p = rng.integers(0, 4, (5, 50)), rng.integers(0, 4, (5, 50))
    p[0] = np.where(p[0] == 3, 0, p[0])  # a class never predicted in one row
    got = metric_of_predictions(y, p, 4, "macro_f1")
    expected = [classification_metrics(y[i], p[i], 4).macro_f1 for i in range(5)]
    assert got.tolist() == pytest.approx(expected)
    assert metric_of_predictions(y, p, 4, "accuracy").tolist() == pytest.approx((y == p).mean(axis=1).tolist())


# --------------------------------------------------------------------------- one candidate


@pytest.fixture(scope="module")
def inputs():
    """The run's shared inputs over a dense model that has learnt the task (P = 2 points)."""
    train, validation = _encoded(160, 0), _encoded(60, 2)
    from cahp_engine.recovery import TrainingRecipe, finetune

    dense = make_classifier("bert", layers=2, heads=4, seed=1)
    finetune(dense, train, TrainingRecipe(epochs=6, lr=2e-3, batch_size=16, warmup_ratio=0.1, weight_decay=0.01,
                                          max_grad_norm=1.0, seed=0))
    config = PruningConfig(epochs=3, lr=5e-4, batch_size=16, seed=4, max_accuracy_drop=2.0, recovery_loss="ce")
    predictions = predict(dense, validation, batch_size=16)
    metrics = classification_metrics(validation.labels, predictions, 3)
    return SearchInputs(dense=dense, train=train, validation=validation, dense_validation=metrics,
                        dense_predictions=predictions, teacher=None, class_weights=None, config=config,
                        device=torch.device("cpu"), threshold=metrics.accuracy - 0.02)


def _spec(until: float, **changes) -> CandidateSpec:
    base = CandidateSpec(strategy="cahp", k=3, kept={0: (0, 2), 1: (1,)}, seed=4, until_epochs=until,
                         finish=True)
    return dataclasses.replace(base, **changes)


def test_a_candidate_is_a_deterministic_unit_of_work_that_resumes_exactly(inputs):
    straight = recover_candidate(_spec(3.0), inputs)
    again = recover_candidate(_spec(3.0), inputs)
    assert straight.curve == again.curve and straight.drop == again.drop
    first = recover_candidate(_spec(1.0, finish=False, gain_per_epoch=None), inputs)
    assert first.epochs == pytest.approx(1.0) or first.status == "within_budget"
    resumed = recover_candidate(_spec(3.0), inputs, resume=first.run)
    assert resumed.curve == straight.curve and resumed.epochs == straight.epochs == 3.0
    for a, b in zip(straight.run.model.state_dict().values(), resumed.run.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert json.loads(json.dumps(_spec(1.0).to_dict())) == _spec(1.0).to_dict()  # small and serialisable
    assert CandidateSpec.from_dict(_spec(1.0).to_dict()) == _spec(1.0)


def test_a_candidate_that_loses_a_class_fails_the_budget_whatever_its_score(inputs):
    # The pruned copies come from a dense model that never predicts class 2; the dense model the
    # budget compares with recalls it. With a threshold every score meets, only the lost class fails it.
    deaf = copy.deepcopy(inputs.dense)
    with torch.no_grad():
        deaf.classifier.bias[2] = -1e4
    lenient = dataclasses.replace(inputs, dense=deaf, threshold=-1.0,
                                  config=inputs.config.replace(lr=1e-9, max_accuracy_drop=100.0))
    result = recover_candidate(_spec(3.0, finish=False), lenient)
    assert result.status == "completed" and not result.run.met
    assert all(p.lost_classes == (2,) and p.score > 0.3 for p in result.curve)
    # The same candidate keeping class 2 meets it at once.
    kept = recover_candidate(_spec(3.0, finish=False), dataclasses.replace(lenient, dense=inputs.dense))
    assert kept.status == "within_budget" and kept.curve[0].lost_classes == ()


def test_the_strict_mode_needs_the_drops_upper_bound_within_p(inputs):
    scorer = ValidationScorer(inputs.validation, "accuracy", inputs.dense_validation, 16, torch.device("cpu"))
    model = copy.deepcopy(inputs.dense)
    point = scorer(model, 0, 0.0)
    flipped = scorer.predictions[-1].copy()
    flipped[:2] = (flipped[:2] + 1) % 3  # two rows of 60 differ from the dense model's answers
    at_threshold = dataclasses.replace(point, score=inputs.threshold)
    assert inputs.meets(at_threshold, flipped)  # the measured drop is within P ...
    strict = dataclasses.replace(inputs, config=inputs.config.replace(budget_confidence=0.9))
    assert strict.drop(flipped).upper > 2.0
    assert not strict.meets(at_threshold, flipped)  # ... its upper bound is not
    assert strict.meets(point, scorer.predictions[-1])  # the dense model's own answers: a drop of 0 for sure


# --------------------------------------------------------------------------- the validation split


def test_a_dataset_too_small_to_carve_a_validation_split_says_how_many_rows_are_needed():
    texts = ("good film", "bad film", "fun plot", "dull plot", "the end")
    data = LabelledTexts(texts, np.array([0, 0, 1, 1, 2]), ("neg", "pos", "odd"))
    with pytest.raises(DatasetError, match=r"class 'odd' has 1 row\(s\), and carving needs at least 2 rows of "
                                           r"every class .*Add a `validation` split"):
        carve(data, seed=0)


# --------------------------------------------------------------------------- whole runs


class _Guarded:
    """An evaluation split that fails the test when read while ``on['watching']`` is set."""

    def __init__(self, real, on):
        self._real, self._on = real, on

    def __getattr__(self, name):
        if self._on["watching"]:
            raise AssertionError(f"the evaluation split was read while judging on validation ({name})")
        return getattr(self._real, name)

    def __len__(self):
        if self._on["watching"]:
            raise AssertionError("the evaluation split was read while judging on validation (len)")
        return len(self._real)


@pytest.fixture
def guard_evaluation(monkeypatch):
    """Reading the evaluation split during the budget's search or a recovery that validates fails."""
    on = {"watching": False, "calls": 0}
    load, search, recover = steps.load, steps.budget_search, steps.recover

    def guarded_load(*args, **kwargs):
        loaded = load(*args, **kwargs)
        return dataclasses.replace(loaded, evaluation=_Guarded(loaded.evaluation, on))

    def watched(function):
        def call(*args, **kwargs):
            on["watching"], on["calls"] = True, on["calls"] + 1
            try:
                return function(*args, **kwargs)
            finally:
                on["watching"] = False
        return call

    monkeypatch.setattr(steps, "load", guarded_load)
    monkeypatch.setattr(steps, "budget_search", watched(search))
    monkeypatch.setattr(steps, "recover", watched(recover))
    return on


def _bisection(heads: list[int], feasible) -> list[int]:
    """The head counts a bisection over ``heads`` probes, given which are within the budget."""
    lo, hi, probed = -1, len(heads), []
    while hi - lo > 1:
        mid = (lo + hi) // 2
        probed.append(heads[mid])
        lo, hi = (lo, mid) if feasible(heads[mid]) else (mid, hi)
    return probed


def test_a_knee_run_with_early_stopping_keeps_its_best_on_a_carved_split(tmp_path, model_dir, guard_evaluation):
    data = _dataset(tmp_path / "data", {"train": (150, 0), "test": (45, 1)})
    config = PruningConfig(**{**FAST, "epochs": 3, "lr": 0.05}, early_stopping_patience=1)
    report = run_pruning(RunRequest(model_ref=str(model_dir), dataset_ref=str(data), output_dir=tmp_path / "out",
                                    config=config))
    assert guard_evaluation["calls"] == 1  # the recovery ran under the guard
    v = report.validation
    assert v is not None and v.carved and v.split == "train" and v.rows == 15 and v.metric == "accuracy"
    assert report.dataset.train_rows == 135  # the carved rows are neither selected on nor trained on
    r = report.recovery
    assert r.validation[0].step == 0 and r.early_stopping_patience == 1
    best = next(p for p in r.validation if p.step == r.best_step)
    assert best.score == max(p.score for p in r.validation) and r.best_epoch == best.epoch
    # At lr 0.05 the first epoch wrecks the model: the start is kept and training stops after one epoch.
    assert r.best_step == 0 and r.stopped_early and r.epochs == 1.0 and len(r.validation) == 2
    on_disk = json.loads((tmp_path / "out" / "report.json").read_text())
    assert on_disk["validation"] == v.to_dict() and on_disk["recovery"]["best_epoch"] == 0.0
    assert on_disk["recovery"]["validation"][0] == r.validation[0].to_dict()
    assert RunReport.from_dict(on_disk) == dataclasses.replace(report, wall_time_s=on_disk["wall_time_s"])
    from app.cli.prune import format_summary

    text = format_summary(report, tmp_path / "out")
    assert "validation accuracy (15 rows carved from 'train'; dense" in text and "by epoch: 0: " in text
    assert "kept the weights of epoch 0 (*); stopped early: 1 evaluation(s) without gain" in text


def _scores(accuracy: float, n: int, macro_f1: float | None = None) -> ClassificationMetrics:
    return ClassificationMetrics(accuracy=accuracy, macro_f1=accuracy if macro_f1 is None else macro_f1, n=n)


def test_carved_rows_far_above_the_evaluation_split_are_called_rows_the_dense_model_learnt():
    said = seen_in_training(_scores(0.90, 200), _scores(0.70, 1000), "accuracy")
    assert said is not None and "scores 90.0 % accuracy on them against 70.0 % on the evaluation split (20.0 points " \
                                "higher)" in said and "give the dataset a `validation` split" in said
    assert seen_in_training(_scores(0.74, 2000), _scores(0.70, 2000), "accuracy") is None  # under 5 points
    # 10 points on 20 carved rows is inside three standard errors (about 27 points): nothing said.
    assert seen_in_training(_scores(0.80, 20), _scores(0.70, 1000), "accuracy") is None
    assert seen_in_training(_scores(0.70, 500), _scores(0.90, 500), "accuracy") is None  # lower is no sign of it
    said = seen_in_training(_scores(0.5, 500, macro_f1=0.88), _scores(0.5, 500, macro_f1=0.60), "macro_f1")
    assert said is not None and "88.0 % macro-F1" in said


def test_a_model_fine_tuned_on_the_rows_the_run_carves_is_warned_about(tmp_path, model_dir):
    # The evaluation split moves every label one class on, so a model that learnt the training split scores
    # far higher on rows carved from it than on the evaluation split, whether it saw them or not.
    data = tmp_path / "data"
    write_split(data / "train.csv", 300, seed=0)
    texts, labels = make_texts(90, seed=1)
    (data / "test.csv").write_text("text,label\n" + "".join(f"{t},{(y + 1) % 3}\n" for t, y in zip(texts, labels,
                                                                                                     strict=True)))
    tuned = tmp_path / "tuned"
    model = make_classifier("bert", layers=3, heads=4, num_labels=3, seed=2)
    train_texts, train_labels = make_texts(300, seed=0)  # the training split, carved rows included
    finetune(model, encode(make_tokenizer(), LabelledTexts(tuple(train_texts), train_labels, ("0", "1", "2")),
                           max_length=32),
             TrainingRecipe(epochs=6, lr=2e-3, batch_size=16, warmup_ratio=0.1, weight_decay=0.01,
                            max_grad_norm=1.0, seed=0))
    model.save_pretrained(tuned)
    make_tokenizer().save_pretrained(tuned)
    # The evaluation split makes it look untrained (near chance there): pruned all the same.
    config = PruningConfig(**{**FAST, "dense_finetune": "never", "epochs": 1}, early_stopping_patience=1,
                           untrained_dense="warn")
    report = run_pruning(RunRequest(model_ref=str(tuned), dataset_ref=str(data), output_dir=tmp_path / "out",
                                    config=config))
    v = report.validation
    assert v is not None and v.carved and v.dense.accuracy - report.metrics.dense.accuracy > 0.3  # it learnt train
    seen = [w for w, code in zip(report.warnings, report.summary.warning_codes, strict=True)
            if code == "validation_seen"]
    assert len(seen) == 1 and f"scores {100 * v.dense.accuracy:.1f} % accuracy on them" in seen[0], report.warnings
    on_disk = json.loads((tmp_path / "out" / "report.json").read_text())
    assert "validation_seen" in on_disk["summary"]["warning_codes"]
    # A run that fine-tunes the dense model itself trains it on what is left after carving: nothing to say,
    # though the gap is as wide.
    again = run_pruning(RunRequest(model_ref=str(tuned), dataset_ref=str(data), output_dir=tmp_path / "again",
                                   config=config.replace(dense_finetune="always")))
    assert again.validation is not None and again.validation.dense.accuracy - again.metrics.dense.accuracy > 0.3
    assert "validation_seen" not in again.summary.warning_codes


def test_the_paper_protocol_reads_no_validation_split(tmp_path, model_dir):
    data = _dataset(tmp_path / "data", {"train": (90, 0), "test": (30, 1)})
    report = run_pruning(RunRequest(model_ref=str(model_dir), dataset_ref=str(data), output_dir=tmp_path / "out",
                                    config=PruningConfig(**FAST)))
    assert report.validation is None and report.dataset.train_rows == 90
    assert report.recovery.validation == () and report.recovery.best_step is None


def test_a_budget_search_bisects_the_ladder_and_returns_the_smallest_candidate(tmp_path, model_dir,
                                                                               guard_evaluation):
    data = _dataset(tmp_path / "data", {"train": (150, 0), "test": (45, 1)})
    config = PruningConfig(**FAST, max_accuracy_drop=100.0, budget_screen_epochs=0.5, recovery="finetune")
    report = run_pruning(RunRequest(model_ref=str(model_dir), dataset_ref=str(data), output_dir=tmp_path / "out",
                                    config=config))
    assert guard_evaluation["calls"] == 1
    b = report.budget
    assert b is not None and b.carved and b.split == "train" and b.validation_rows == 15
    assert b.strategies == ("cahp", "salience") and b.ladder == tuple(sorted(b.ladder))
    # P = 100 points: every head count meets it, so the bisection walks down to the fewest heads.
    rounds = sorted({c.round for c in b.candidates})
    probed = [next(c.heads_kept for c in b.candidates if c.round == r and c.strategy == "cahp") for r in rounds]
    assert probed == _bisection(list(b.ladder), lambda _heads: True)
    assert len(rounds) <= math.ceil(math.log2(len(b.ladder) + 1))
    chosen = [c for c in b.candidates if c.chosen]
    assert len(chosen) == 1 and b.chosen == chosen[0].heads_kept == b.ladder[0] == report.summary.heads_kept
    assert b.chosen_strategy == chosen[0].strategy == report.selection.strategy
    # Every candidate of a round comes from another strategy; before training they already meet P = 100.
    for r in rounds:
        assert [c.strategy for c in b.candidates if c.round == r] in (["cahp", "salience"], ["cahp"])
    assert all(c.within_budget and c.curve[0].step == 0 for c in b.candidates)
    # The chosen one's recovery went on to the end of the protocol and is the run's recovery.
    assert chosen[0].epochs == 2.0 and report.recovery.validation == chosen[0].curve
    assert report.recovery.steps == 2 * math.ceil(135 / 16) and b.epochs_trained == 2.0
    assert b.noise_half_width == chosen[0].drop.half_width and b.strategy_margin is not None
    on_disk = json.loads((tmp_path / "out" / "report.json").read_text())
    assert on_disk["budget"] == b.to_dict() and RunReport.from_dict(on_disk).budget == b
    assert (tmp_path / "out" / "budget.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from app.cli.prune import format_summary

    text = format_summary(report, tmp_path / "out")
    assert "chosen by the accuracy budget" in text and "<- chosen" in text
    assert f"chosen: {b.chosen} heads by {b.chosen_strategy}" in text and "drop " in text and "(95 % " in text


def test_a_budget_nobody_meets_halves_each_round_and_records_every_candidate(tmp_path, guard_evaluation):
    # A dense model whose heads cancel each other's offsets: every pruned copy answers one class.
    model = write_fragile_model(tmp_path / "fragile", train_rows=150, train_seed=1)
    data = _dataset(tmp_path / "data", {"train": (150, 1), "validation": (60, 2), "test": (45, 3)})
    out = tmp_path / "out"
    config = PruningConfig(**{**FAST, "epochs": 3, "dense_finetune": "never", "untrained_dense": "warn"},
                           max_accuracy_drop=5.0, recovery="finetune",
                           budget_metric="macro_f1")
    with pytest.raises(AccuracyBudgetError, match="no candidate kept validation macro_f1 within 5 points") as err:
        run_pruning(RunRequest(model_ref=str(model), dataset_ref=str(data), output_dir=out, config=config))
    assert err.value.code == "accuracy_budget_not_met" and "95 % interval" in str(err.value)
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "failed" and report["validation"]["split"] == "validation"
    b = report["budget"]
    assert b["dense_validation"] > 0.8 and b["chosen"] is None and b["chosen_strategy"] is None
    assert not any(c["within_budget"] or c["chosen"] for c in b["candidates"])
    ladder = b["ladder"]
    rounds = sorted({c["round"] for c in b["candidates"]})
    probed = [next(c["heads_kept"] for c in b["candidates"] if c["round"] == r) for r in rounds]
    assert probed == _bisection(ladder, lambda _heads: False) and probed[-1] == ladder[-1] == 11  # up to N - 1
    for r in rounds:
        cands = [c for c in b["candidates"] if c["round"] == r]
        assert len(cands) == 2  # CAHP's and salience's choices differ on this model
        # Successive halving: both trained the first rung; the more promising one trained on until its
        # own curve showed it could not reach the threshold.
        halved = [c for c in cands if c["stopped"] == "halved"]
        assert len(halved) == 1 and halved[0]["epochs"] == 1.0
        other = next(c for c in cands if c is not halved[0])
        assert other["epochs"] == 2.0 and other["stopped"] == "cannot_reach" and "falls short" in other["reason"]
        for c in cands:
            assert c["curve"][0]["step"] == 0 and c["drop"]["low"] <= c["drop"]["drop"] <= c["drop"]["high"]
            assert all(p["lost_classes"] for p in c["curve"])  # one class for every input: two lost
    assert b["epochs_trained"] == 3 * len(rounds)
    # 60 rows cannot resolve 5 points of macro-F1 around such a drop: the report says so.
    assert b["noise_half_width"] > 5 and any(w.startswith("the validation split cannot tell a 5-point drop")
                                             for w in report["warnings"])
    assert {p.name for p in out.iterdir()} == {"report.json", "mss_curve.json", "mss_curve.png", "head_map.json",
                                               "head_map.png", "layer_retention.png", "budget.png"}


def test_the_search_is_deterministic_for_a_seed(tmp_path, model_dir):
    data = _dataset(tmp_path / "data", {"train": (150, 0), "validation": (30, 2), "test": (45, 1)})
    config = PruningConfig(**{**FAST, "epochs": 2}, max_accuracy_drop=1.0)
    runs = [run_pruning(RunRequest(model_ref=str(model_dir), dataset_ref=str(data), output_dir=tmp_path / f"out{i}",
                                   config=config)) for i in range(2)]

    def timeless(report):
        budget = report.budget.to_dict()
        for key in ("search_seconds", "final_recovery_seconds", "cost_vs_single_run"):
            budget.pop(key)
        for c in budget["candidates"]:
            c.pop("seconds")
        return budget

    assert timeless(runs[0]) == timeless(runs[1]) and len(runs[0].budget.candidates) >= 2
    assert runs[0].metrics.pruned == runs[1].metrics.pruned and runs[0].selection.kept == runs[1].selection.kept


def test_the_noise_warning_names_p_and_the_half_width():
    record = BudgetRecord(
        max_accuracy_drop=1.0, metric="accuracy", split="validation", carved=False, validation_rows=1101,
        dense_validation=0.489, threshold=0.479, strategies=("cahp",), confidence=None, ladder=(36,), candidates=(),
        chosen=36, chosen_strategy="cahp", strategy_margin=None, noise_half_width=2.93, epochs_trained=3.0,
        search_seconds=1.0, final_recovery_seconds=1.0, cost_vs_single_run=1.0)
    assert budget_warnings(record) == [
        "the validation split cannot tell a 1-point drop from noise: +-2.9 points (95 % interval of the drop over "
        "1101 rows); a larger validation split or a larger `max_accuracy_drop` makes the budget's decision "
        "meaningful"]
    assert budget_warnings(dataclasses.replace(record, max_accuracy_drop=3.0)) == []


def test_the_recovered_model_is_the_chosen_candidates_best_on_validation(tmp_path, model_dir):
    data = _dataset(tmp_path / "data", {"train": (150, 0), "validation": (45, 2), "test": (45, 1)})
    config = PruningConfig(**FAST, max_accuracy_drop=5.0)
    report = run_pruning(RunRequest(model_ref=str(model_dir), dataset_ref=str(data), output_dir=tmp_path / "out",
                                    config=config))
    from cahp_engine import load_pruned

    model = load_pruned(tmp_path / "out" / "model")
    tokenizer = make_tokenizer()
    texts = _dataset_rows(data / "validation.csv")
    validation = encode(tokenizer, texts, max_length=config.max_length)
    chosen = next(c for c in report.budget.candidates if c.chosen)
    assert evaluate(model, validation).accuracy == pytest.approx(chosen.accuracy_best)
    assert chosen.accuracy_best >= chosen.accuracy_before


def _dataset_rows(path: Path) -> LabelledTexts:
    import csv

    with path.open() as handle:
        rows = list(csv.DictReader(handle))
    return LabelledTexts(tuple(r["text"] for r in rows), np.array([int(r["label"]) for r in rows]),
                         ("0", "1", "2"))
