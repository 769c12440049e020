"""The time left from each stage's measured throughput (``ThroughputEta``), on a controlled clock."""

from __future__ import annotations

import pytest

from cahp_engine.config import PruningConfig
from cahp_engine.progress import ThroughputEta, skipped_stages, stage_costs, stage_spans

SPANS = {"load": (0.0, 0.1), "dense_finetune": (0.1, 0.5), "selection": (0.5, 0.6), "recovery": (0.6, 1.0)}
COSTS = {"load": 10.0, "dense_finetune": 100.0, "selection": 10.0, "recovery": 100.0}


def _overall(stage: str, fraction: float) -> float:
    lo, hi = SPANS[stage]
    return lo + (hi - lo) * fraction


def test_the_current_stage_goes_at_its_own_rate_and_later_ones_at_this_runs_speed_by_kind() -> None:
    eta = ThroughputEta(SPANS, COSTS)
    # Loading takes 20 s where the calibration took 10: the fixed-cost stages run at half speed here.
    assert eta.update(0.0, "load", _overall("load", 0.0)) is None  # nothing measured yet
    eta.update(20.0, "load", _overall("load", 1.0))
    # The first seconds of fine-tuning: no rate of its own yet; the loading's speed stands in for it.
    assert eta.update(20.0, "dense_finetune", _overall("dense_finetune", 0.0)) == pytest.approx(2 * 210)
    # Fine-tuning goes at 1 % a second (100 s in all, as calibrated): 90 s left of it, then selection at
    # the loading's speed (2 x 10 s) and recovery at the fine-tuning's (1 x 100 s).
    for second in range(1, 11):
        left = eta.update(20.0 + second, "dense_finetune", _overall("dense_finetune", second / 100))
    assert left == pytest.approx(90 + 20 + 100)


def test_recovery_twice_as_slow_as_calibrated_is_foretold_from_its_own_rate() -> None:
    eta = ThroughputEta(SPANS, COSTS)
    now = 0.0
    for stage, seconds in (("load", 10.0), ("dense_finetune", 100.0), ("selection", 10.0)):
        eta.update(now, stage, _overall(stage, 0.0))
        now += seconds
        eta.update(now, stage, _overall(stage, 1.0))
    for second in range(0, 101):  # half of recovery in 100 s: 100 s left
        left = eta.update(now + second, "recovery", _overall("recovery", second / 200))
    assert left == pytest.approx(100.0)


def test_a_stage_the_spans_do_not_place_counts_the_estimate_down_rather_than_freezing_it() -> None:
    eta = ThroughputEta(SPANS, COSTS)
    eta.update(0.0, "load", 0.0)
    first = eta.update(10.0, "load", _overall("load", 1.0))
    assert first is not None
    assert eta.update(25.0, "validation", 0.1) == pytest.approx(first - 15.0)


def test_the_costs_follow_the_runs_stages_and_epochs() -> None:
    config = PruningConfig(epochs=1, dense_epochs=6, dense_finetune="auto", export="none")
    costs = stage_costs(config)
    full = stage_costs(PruningConfig(epochs=3, dense_epochs=3, export="onnx"))
    assert costs["recovery"] == pytest.approx(full["recovery"] / 3)
    assert costs["dense_finetune"] == pytest.approx(full["dense_finetune"] * 2)
    assert costs["export"] == 0.0 and costs["budget"] == 0.0
    # The spans the engine reports through place every stage the costs count.
    spans = stage_spans(skipped_stages(config))
    assert all(spans[stage][1] > spans[stage][0] for stage, cost in costs.items() if cost > 0)
