"""What a pruned model says about itself: identity, recipe, quality flags, one speed measurement, its cards."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from huggingface_hub import ModelCard

from cahp_engine.config import PruningConfig
from cahp_engine.errors import InvalidInputError
from cahp_engine.export import describe_speedup
from cahp_engine.recovery import ClassificationMetrics, speedup_interval
from cahp_engine.run import FailedRunMetrics, FailedRunReport, RunError, RunIdentity, RunReport, RunRequest, run_pruning
from cahp_engine.run._completion import complete_failed_report
from cahp_engine.run._identity import identity_of
from cahp_engine.run._quality import MAX_ACCURACY_DROP, AccuracyBudget, assess_quality, chance_macro_f1
from cahp_engine.run._report import DatasetInfo, DenseFinetuneRecord, Environment, ModelInfo, SelectionRecord
from tests.support.tiny_models import make_classifier, make_texts, make_tokenizer

NAMES = ("bad", "fine", "good")


def _metrics(confusion: list[list[int]]) -> ClassificationMetrics:
    """Scores computed from a confusion matrix the way the engine computes them."""
    from cahp_engine.recovery import classification_metrics

    true = np.concatenate([np.full(sum(row), i) for i, row in enumerate(confusion)])
    pred = np.concatenate([np.repeat(np.arange(len(row)), row) for row in confusion])
    return classification_metrics(true, pred, len(confusion))


def test_chance_is_the_best_guess_that_reads_no_text() -> None:
    assert chance_macro_f1([20, 20, 20, 20, 20]) == pytest.approx(0.2)
    # Very unequal classes: always guessing the largest one beats a uniform guess.
    assert chance_macro_f1([90, 10]) == pytest.approx(max(2 * 0.9 / 1.9 / 2, 0.5))
    assert chance_macro_f1([]) == 0.0


def test_a_model_that_predicts_two_of_five_classes_is_flagged_whatever_the_pruned_one_does() -> None:
    # The dense model: 5 balanced classes, only two ever predicted, macro-F1 near 0.18.
    broken = _metrics([[10, 0, 0, 10, 0], [12, 0, 0, 8, 0], [9, 0, 0, 11, 0], [6, 0, 0, 14, 0], [5, 0, 0, 15, 0]])
    healthy = _metrics([[15, 3, 1, 1, 0], [3, 12, 3, 1, 1], [1, 3, 12, 3, 1], [0, 1, 3, 13, 3], [0, 1, 1, 3, 15]])
    names = ("very negative", "negative", "neutral", "positive", "very positive")
    record = assess_quality(dense=broken, pruned=broken, int8=broken, label_names=names, budget=None)
    kinds = {(f.model, f.kind) for f in record.flags}
    assert kinds == {(m, k) for m in ("dense", "pruned", "onnx-int8") for k in ("missing_classes", "near_chance")}
    missing = next(f for f in record.flags if f.model == "dense" and f.kind == "missing_classes")
    assert missing.classes == ("negative", "neutral", "very positive")
    assert missing.message == ("the dense model never predicts 'negative', 'neutral', 'very positive': it predicts 2 "
                               "of the 5 classes of the evaluation split")
    assert record.chance_macro_f1 == pytest.approx(0.2) and record.near_chance_below == pytest.approx(0.28)
    assert assess_quality(dense=healthy, pruned=healthy, int8=None, label_names=names,
                          budget=None).flags == ()


def test_a_drop_beyond_the_budget_or_the_threshold_is_flagged() -> None:
    dense = _metrics([[18, 2], [2, 18]])  # 90 %
    pruned = _metrics([[16, 4], [3, 17]])  # 82.5 %: 7.5 points down
    int8 = _metrics([[15, 5], [4, 16]])  # 77.5 %: 5 points below the pruned model
    without = assess_quality(dense=dense, pruned=pruned, int8=int8, label_names=("a", "b"), budget=None)
    assert without.drop_rule == "threshold" and without.max_accuracy_drop == MAX_ACCURACY_DROP
    assert [(f.model, f.kind) for f in without.flags] == [("pruned", "accuracy_drop"), ("onnx-int8", "accuracy_drop")]
    assert "7.5 points below the dense model's 90.00%" in without.flags[0].message
    within = assess_quality(dense=dense, pruned=pruned, int8=None, label_names=("a", "b"),
                            budget=AccuracyBudget(10.0))
    assert within.flags == () and within.drop_rule == "budget"
    beyond = assess_quality(dense=dense, pruned=pruned, int8=None, label_names=("a", "b"),
                            budget=AccuracyBudget(5.0))
    assert "more than the accuracy budget of 5 points" in beyond.flags[0].message


def test_a_macro_f1_budget_holds_macro_f1_to_it_and_accuracy_to_the_threshold() -> None:
    dense = _metrics([[18, 2], [2, 18]])  # 90 %, macro-F1 0.90
    pruned = _metrics([[16, 4], [3, 17]])  # 82.5 %: 7.5 points down; macro-F1 about 7.5 points down
    gentle = _metrics([[17, 3], [2, 18]])  # 87.5 %: 2.5 points down
    f1_drop = 100 * (dense.macro_f1 - pruned.macro_f1)
    within = assess_quality(dense=dense, pruned=gentle, int8=None, label_names=("a", "b"),
                            budget=AccuracyBudget(3.0, "macro_f1"))
    assert within.flags == () and within.drop_metric == "macro_f1" and within.drop_rule == "budget"
    beyond = assess_quality(dense=dense, pruned=pruned, int8=None, label_names=("a", "b"),
                            budget=AccuracyBudget(5.0, "macro_f1"))
    assert [f.kind for f in beyond.flags] == ["macro_f1_drop", "accuracy_drop"]
    assert f"macro-F1 {pruned.macro_f1:.2%} is {f1_drop:.1f} points below" in beyond.flags[0].message
    assert "more than the macro-F1 budget of 5 points" in beyond.flags[0].message
    assert beyond.flags[1].message.endswith("more than 5 points")  # the threshold, not the budget
    # without a budget the metric is accuracy
    assert assess_quality(dense=dense, pruned=pruned, int8=None, label_names=("a", "b"),
                          budget=None).drop_metric == "accuracy"


def test_a_speed_up_inside_its_noise_is_no_measurable_change() -> None:
    rng = np.random.default_rng(0)
    same = rng.normal(10.0, 1.0, 40)
    noisy = same + rng.normal(0.0, 1.0, 40)
    low, high = speedup_interval(same, noisy, seed=1)
    assert low < 1.0 < high
    assert describe_speedup(float(np.median(same) / np.median(noisy)), low, high).startswith("no measurable change")
    faster = same / 2
    low, high = speedup_interval(same, faster, seed=1)
    assert 1.9 < low <= high < 2.1
    assert describe_speedup(2.0, low, high) == f"x2.00 (95 % interval x{low:.2f}-x{high:.2f})"
    assert describe_speedup(0.5) == "x0.50" and describe_speedup(None) == "not measured"
    with pytest.raises(InvalidInputError, match="paired rounds of the same length"):
        speedup_interval([1.0, 2.0], [1.0])


def test_the_base_model_is_named_by_hub_id_then_name_or_path_then_directory(tmp_path: Path) -> None:
    model = tmp_path / "upload-3f2c"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "bert"}))
    given = RunIdentity(base_model="my-minilm", dataset="sst5-800", job_id="j1", labels={"git/commit": "4f2c"})
    plain = identity_of(given, model_ref=str(model), dataset_ref=str(tmp_path), class_names=NAMES)
    assert (plain.base_model, plain.base_model_hub_id, plain.dataset) == ("my-minilm", None, "sst5-800")
    assert plain.labels == {"git/commit": "4f2c"} and plain.class_names == NAMES and plain.job_id == "j1"
    (model / "config.json").write_text(json.dumps({"_name_or_path": "sentence-transformers/all-MiniLM-L6-v2"}))
    declared = identity_of(given, model_ref=str(model), dataset_ref=str(tmp_path), class_names=NAMES)
    assert declared.base_model == declared.base_model_hub_id == "sentence-transformers/all-MiniLM-L6-v2"
    (model / "config.json").write_text(json.dumps({"_name_or_path": "/home/me/models/bert-reviews"}))
    assert identity_of(given, model_ref=str(model), dataset_ref=str(tmp_path),
                       class_names=NAMES).base_model == "bert-reviews"
    hub = identity_of(RunIdentity(base_model_hub_id="prajjwal1/bert-tiny", dataset_hub_id="SetFit/sst5"),
                      model_ref=str(model), dataset_ref=str(tmp_path), class_names=NAMES)
    assert (hub.base_model, hub.dataset, hub.dataset_hub_id) == ("prajjwal1/bert-tiny", "SetFit/sst5", "SetFit/sst5")
    bare = identity_of(None, model_ref="org/some-model", dataset_ref=str(tmp_path / "reviews"), class_names=NAMES)
    assert (bare.base_model_hub_id, bare.dataset, bare.name) == ("org/some-model", "reviews", None)


def _write_named_dataset(root: Path) -> Path:
    data = root / "reviews"
    data.mkdir()
    for split, n, seed in (("train", 60, 1), ("test", 30, 2)):
        texts, labels = make_texts(n, num_classes=3, seed=seed)
        with (data / f"{split}.csv").open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["text", "label"])
            writer.writerows((t, NAMES[int(y)]) for t, y in zip(texts, labels, strict=True))
    return data


@pytest.mark.slow
def test_a_run_says_what_it_made_warns_and_quotes_one_measurement(tmp_path: Path) -> None:
    # A two-class checkpoint on a three-class dataset: cahp creates the head; left untrained, it is broken.
    model = tmp_path / "model"
    make_classifier("bert", num_labels=2, layers=2, heads=4, seed=0).save_pretrained(model)
    make_tokenizer().save_pretrained(model)
    data = _write_named_dataset(tmp_path)
    config = PruningConfig(epochs=0.5, dense_finetune="never", untrained_dense="warn", batch_size=16, max_length=32,
                           seed=3, device="cpu",
                           latency_warmup=1, latency_repeats=4, strategy="random", heads_to_keep=5, quantize="int8")
    identity = RunIdentity(name="reviews-pruned", job_id="job-1", labels={"git/commit": "4f2c9e1"},
                           base_model="my-bert")
    report = run_pruning(RunRequest(model_ref=str(model), dataset_ref=str(data), output_dir=tmp_path / "out",
                                    config=config, identity=identity))
    out = tmp_path / "out"

    written = json.loads((out / "report.json").read_text())
    assert RunReport.from_dict(written) == report
    assert written["identity"] == {"name": "reviews-pruned", "base_model": "my-bert", "base_model_hub_id": None,
                                   "dataset": "reviews", "dataset_hub_id": None, "class_names": list(NAMES),
                                   "job_id": "job-1", "labels": {"git/commit": "4f2c9e1"},
                                   "cahp_version": report.identity.cahp_version}
    recipe = written["recipe"]
    assert recipe["classifier_head"] == "new" and recipe["dense_finetune"] is None
    assert recipe["recovery"]["epochs"] == 0.5 and recipe["recovery"]["loss"] == "distill" and recipe["seed"] == 3
    assert (recipe["train_rows"], recipe["eval_rows"], recipe["heads_kept"]) == (60, 30, 5)
    # The head cahp created names the dataset's classes, in every directory.
    for directory in ("model", "onnx", "onnx-int8"):
        assert json.loads((out / directory / "config.json").read_text())["id2label"] == {"0": "bad", "1": "fine",
                                                                                         "2": "good"}

    # Quality: every class some model never predicts is flagged, first in the warnings, everywhere.
    quality = report.quality
    assert quality is not None and quality.flags
    for key, metrics in (("dense", report.metrics.dense), ("pruned", report.metrics.pruned)):
        predicted = np.asarray(metrics.confusion).sum(axis=0)
        never = tuple(NAMES[c] for c in range(3) if predicted[c] == 0)
        flagged = [f.classes for f in quality.flags if f.model == key and f.kind == "missing_classes"]
        assert flagged == ([never] if never else [])
    assert report.warnings[:len(quality.flags)] == quality.messages
    assert report.summary.warnings == report.warnings and report.summary.base_model == "my-bert"
    # Each warning has its code, in the same order: the flags' own, and the untrained head's.
    codes = report.summary.warning_codes
    assert len(codes) == len(report.warnings) and codes[0] in ("class_lost", "near_chance")
    untrained = next(w for w in report.warnings if "head is untrained" in w)
    assert codes[report.warnings.index(untrained)] == "untrained_head"
    assert written["summary"]["warning_codes"] == list(codes)

    # One measurement: the report's speed, the summary and the export's timing are the same numbers.
    assert report.export.speed is not None
    row = report.export.speed.results[-1]
    assert report.speed.results[-1].pruned == row.latency["torch_pruned"]
    assert report.summary.speedup == row.speedup["torch_pruned"] == report.speed.speedup_at(32)
    assert report.summary.speedup_low == row.speedup_low["torch_pruned"] <= report.summary.speedup
    assert report.summary.int8_speedup == row.speedup["onnx_int8_pruned"]
    assert report.summary.onnx_accuracy is not None and report.summary.int8_max_abs_diff is not None
    assert all(lat.p25_ms is not None and lat.p25_ms <= lat.p50_ms <= lat.p75_ms for lat in row.latency.values())

    # Each directory's card: the job's name, its warnings first, its own graph's parity.
    cards = {d: ModelCard.load(out / d / "README.md") for d in ("model", "onnx", "onnx-int8")}
    for directory, card in cards.items():
        assert card.text.startswith("# reviews-pruned\n\n> **Quality warnings**"), directory
        assert card.data.to_dict()["cahp"]["job_id"] == "job-1"
        # A directory's name is not a hub id: the hub metadata names none.
        assert "base_model" not in card.data.to_dict() and "datasets" not in card.data.to_dict()
        assert "- labels: `git/commit=4f2c9e1`" in card.text and "- classes: 0 = `bad`" in card.text
    onnx_parity = report.export.onnx.parity.max_abs_diff
    int8_deviation = report.export.onnx_int8.deviation.max_abs_diff
    assert f"to {onnx_parity:.1e}" in cards["onnx"].text
    assert f"by up to {int8_deviation:.2g}" in cards["onnx-int8"].text and f"to {onnx_parity:.1e}" not in \
        cards["onnx-int8"].text
    [int8_result] = cards["onnx-int8"].data.to_dict()["model-index"][0]["results"]
    assert int8_result["metrics"][0]["value"] == round(report.summary.int8_accuracy, 4)


def test_a_failed_report_flags_a_broken_dense_model_first_in_its_warnings(tmp_path: Path) -> None:
    # A dense model that answers class 0 to every row of a balanced three-class split.
    broken = _metrics([[10, 0, 0], [10, 0, 0], [10, 0, 0]])
    report = complete_failed_report(_failed_report(broken, warnings=("a budget warning",)), identity=None,
                                    model_ref=str(tmp_path / "bert-reviews"), dataset_ref="org/reviews")
    assert report.quality is not None
    assert [(f.model, f.kind) for f in report.quality.flags] == [("dense", "missing_classes"),
                                                                 ("dense", "near_chance")]
    assert report.quality.flags[0].classes == ("b", "c")
    assert report.warnings == (*report.quality.messages, "a budget warning")
    assert report.quality == assess_quality(dense=broken, pruned=None, int8=None, label_names=("a", "b", "c"),
                                            budget=AccuracyBudget(1.0))
    assert report.identity is not None and (report.identity.base_model, report.identity.dataset_hub_id) == (
        "bert-reviews", "org/reviews")
    assert report.recipe is not None and report.recipe.recovery is None
    assert "recovery fine-tuning: none kept: no candidate met the accuracy budget" in report.recipe.lines()


def _failed_report(dense: ClassificationMetrics, *, warnings: tuple[str, ...]) -> FailedRunReport:
    """The smallest failed report: the records a run that missed its budget writes before it is completed."""
    selection = SelectionRecord(
        strategy="cahp", k_star=4, poly_degree=2, knee_found=True, knees_by_degree={2: 4}, heads_total=12,
        heads_kept=5, retention=5 / 12, kept={0: (0, 1), 1: (2,), 2: (0, 3)}, layer_safety_added=(),
        resolution=6, signature_samples=90, calibration_samples=90, perplexity=3.0, signature_sampling=None,
        calibration_sampling=None, stability=None)
    return FailedRunReport(
        format_version=1, status="failed", error=RunError("accuracy_budget_not_met", "no candidate"),
        created_at="2026-01-01T00:00:00+00:00",
        model=ModelInfo(ref="m", revision=None, family="bert", layers=3, heads_per_layer=4, classifier_trained=True),
        dataset=DatasetInfo(ref="d", source="d", format="files", splits_found=("train", "test"), train_split="train",
                            eval_split="test", text_column="text", text_pair_column=None, label_column="label",
                            config=None, label_names=("a", "b", "c"), train_rows=90, eval_rows=30),
        config=PruningConfig(max_accuracy_drop=1.0), seed=0, device="cpu",
        environment=Environment(python="3", platform="x", cpu_count=1, torch_threads=1, cuda=None, versions={}),
        dense_finetune=DenseFinetuneRecord(mode="never", ran=False, reason="off", training=None),
        selection=selection, metrics=FailedRunMetrics(dense=dense), budget=None, timings_s={}, warnings=warnings)
