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


def test_a_stage_slower_than_the_run_so_far_is_foretold_from_its_own_rate_as_much_as_it_is_done() -> None:
    eta = ThroughputEta(SPANS, COSTS)
    now = 0.0
    for stage, seconds in (("load", 10.0), ("dense_finetune", 100.0), ("selection", 10.0)):
        eta.update(now, stage, _overall(stage, 0.0))
        now += seconds
        eta.update(now, stage, _overall(stage, 1.0))
    # Recovery goes at half its calibrated speed; fine-tuning went at its calibrated speed.
    for second in range(0, 101):  # half of recovery in 100 s: 100 s left at its own rate
        left = eta.update(now + second, "recovery", _overall("recovery", second / 200))
    # Half done, its own rate weighs half; the other half is the run's row-bound speed so far
    # (200 s for 150 calibrated s) on the 50 calibrated s left.
    assert left == pytest.approx(0.5 * 100 + 0.5 * (200 / 150) * 50)
    for second in range(101, 181):  # 90 % done: its own rate (20 s left) weighs 90 %
        left = eta.update(now + second, "recovery", _overall("recovery", second / 200))
    assert left == pytest.approx(0.9 * 20 + 0.1 * (280 / 190) * 10)


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


# A run whose last stages report nothing while they work (an export heard only at its start and end, as
# before it reported its steps), then the artifacts (both fixed-cost).
QUIET_SPANS = {"load": (0.0, 0.1), "recovery": (0.1, 0.6), "export": (0.6, 0.9), "artifacts": (0.9, 1.0)}
QUIET_COSTS = {"load": 10.0, "recovery": 100.0, "export": 40.0, "artifacts": 10.0}


def _quiet_run_to_export() -> tuple[ThroughputEta, float]:
    """Loading at twice its calibrated time, recovery as calibrated; the export just begun (its time)."""
    eta = ThroughputEta(QUIET_SPANS, QUIET_COSTS)
    eta.update(0.0, "load", 0.0)
    eta.update(20.0, "load", 0.1)
    for second in range(0, 101):
        eta.update(20.0 + second, "recovery", 0.1 + 0.5 * second / 100)
    return eta, 120.0


def test_a_stage_that_reports_nothing_is_counted_down_from_its_expected_time() -> None:
    eta, now = _quiet_run_to_export()
    # The fixed-cost stages go at the loading's speed, twice their calibration: 80 s of export, 20 of artifacts.
    assert eta.update(now, "export", 0.6) == pytest.approx(80 + 20)
    # Its silent seconds are neither a slower speed nor a frozen figure: the estimate counts down.
    assert eta.update(now + 30, "export", 0.6) == pytest.approx(100 - 30)
    assert eta.update(now + 60, "export", 0.6) == pytest.approx(100 - 60)


def test_a_silent_stage_past_its_expected_time_keeps_a_share_of_its_time_and_slows_the_stages_after_it() -> None:
    eta, now = _quiet_run_to_export()
    eta.update(now, "export", 0.6)
    # 160 s into an export expected to take 80: it is still running, so it does not say zero; the
    # fixed-cost stages are now known to go at least (20 + 160) s per (10 + 40) calibrated s.
    left = eta.update(now + 160, "export", 0.6)
    speed = (20.0 + 160.0) / (10.0 + 40.0)
    assert left == pytest.approx(ThroughputEta.OVERRUN_SHARE * 160 + speed * 10)
    later = eta.update(now + 200, "export", 0.6)
    assert later is not None and later > left  # still not done: the longer it runs, the more is expected
    # Once it ends (a stage reports its end), the artifacts take the speed that export has shown.
    eta.update(now + 200, "export", 0.9)
    done = eta.update(now + 200, "artifacts", 0.9)
    assert done == pytest.approx((20.0 + 200.0) / (10.0 + 40.0) * 10)


def test_an_export_that_reports_its_steps_is_foretold_from_its_own_rate_as_a_reporting_stage_is() -> None:
    eta, now = _quiet_run_to_export()
    # The export takes 240 s, six times the calibrated 40 and three times what the loading's speed
    # foretold, and reports its steps as it goes (one every 10 s).
    for second in range(0, 121, 10):
        left = eta.update(now + second, "export", 0.6 + 0.3 * second / 240)
    # Half done: its own rate over the last minute (120 s left) weighs half; the other half is the
    # fixed-cost stages' speed measured so far, the export's included ((20 + 120) s for (10 + 20)
    # calibrated s), on its 20 calibrated s left, and the artifacts go at that speed too.
    speed = (20.0 + 120.0) / (10.0 + 20.0)
    assert left == pytest.approx(0.5 * 120 + 0.5 * speed * 20 + speed * 10)
    # Heard only at its start, the same export would be counted down from the loading's speed.
    silent, _ = _quiet_run_to_export()
    silent.update(now, "export", 0.6)
    assert silent.update(now + 120, "export", 0.6) == pytest.approx(ThroughputEta.OVERRUN_SHARE * 120
                                                                      + (20.0 + 120.0) / (10.0 + 40.0) * 10)
