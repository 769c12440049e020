"""Each warning a run writes carries a stable code, taken from the function that writes the warning."""

from __future__ import annotations

import numpy as np

from cahp_engine.recovery import ClassificationMetrics
from cahp_engine.run import WARNING_CODES
from cahp_engine.run._quality import assess_quality
from cahp_engine.run._steps import recall_warnings
from cahp_engine.run._target_record import TargetRecord
from cahp_engine.run._warning_codes import code_warnings, warning_code
from cahp_engine.selection._knee import find_knee


def _metrics(confusion: list[list[int]]) -> ClassificationMetrics:
    from cahp_engine.recovery import classification_metrics

    true = np.concatenate([np.full(sum(row), i) for i, row in enumerate(confusion)])
    pred = np.concatenate([np.repeat(np.arange(len(row)), row) for row in confusion])
    return classification_metrics(true, pred, len(confusion))


def test_quality_flags_get_their_codes_and_other_warnings_theirs_in_order() -> None:
    dense = _metrics([[18, 2, 0], [2, 18, 0], [1, 1, 18]])
    pruned = _metrics([[20, 0, 0], [12, 8, 0], [10, 10, 0]])  # 'c' never predicted, far below the dense model
    int8 = _metrics([[20, 0, 0], [20, 0, 0], [20, 0, 0]])  # one class only: near chance, far below pruned
    quality = assess_quality(dense=dense, pruned=pruned, int8=int8, label_names=("a", "b", "c"),
                             budget=None)
    recall = recall_warnings(dense, pruned, ("a", "b", "c"))
    warnings = (*quality.messages, *recall, "something new")
    codes = code_warnings(warnings, quality.flags)
    assert len(codes) == len(warnings) and set(codes) <= set(WARNING_CODES)
    by_flag = {(f.model, f.kind): code for f, code in zip(quality.flags, codes, strict=False)}
    assert by_flag[("pruned", "missing_classes")] == "class_lost"
    assert by_flag[("onnx-int8", "near_chance")] == "near_chance"
    assert by_flag[("pruned", "accuracy_drop")] == "accuracy_drop"
    assert by_flag[("onnx-int8", "accuracy_drop")] == "int8_accuracy_drop"
    assert codes[len(quality.flags):] == ("recall_drop", "class_lost", "other")


def test_a_knee_that_was_not_found_is_coded() -> None:
    ks = np.arange(1, 9)
    knee = find_knee(ks, np.linspace(0.0, 1.0, 8), degree=1)  # a straight line has no knee
    assert knee.warning is not None and warning_code(knee.warning) == "no_knee"


def test_carved_rows_the_dense_model_learnt_are_coded() -> None:
    from cahp_engine.run._holdout import seen_in_training

    learnt = _metrics([[95, 5, 0], [3, 97, 0], [0, 2, 98]])
    serving = _metrics([[60, 30, 10], [25, 65, 10], [15, 15, 70]])
    said = seen_in_training(learnt, serving, "accuracy")
    assert said is not None and warning_code(said) == "validation_seen"


def _target(measured: float | None, kind: str = "speedup") -> TargetRecord:
    return TargetRecord(
        kind=kind, target=2.0, runtime="pytorch", batch_size=32, seq_len=64, heads_total=12, neurons_total=1536,
        heads_per_layer=(6,) * 6, neurons_per_layer=(700,) * 6, head_strategy="cahp", importance="fisher",
        calibration_rows=512, flops_kept=0.45, predicted_speedup=2.03, reachable_speedup=7.5,
        measured_speedup=measured, dense_ms=None if measured is None else 600.0,
        pruned_ms=None if measured is None else 600.0 / measured, corrections=2, cost_unit="seconds", fit_error=0.03,
        seconds=40.0)


def test_a_speed_target_measured_below_what_was_asked_is_coded_and_says_what_to_change() -> None:
    missed = _target(1.99).shortfall()
    assert missed is not None and warning_code(missed) == "target_missed"
    assert "x1.99" in missed and "ask for at most x1.99" in missed and "after 2 correction(s)" in missed
    assert "BELOW the target" in _target(1.99).headline()
    # At or above the target it is met: no warning, however little above; a FLOPs target is counted, not timed.
    assert _target(2.0).shortfall() is None and _target(2.07).shortfall() is None
    assert _target(None, kind="flops").shortfall() is None
