"""The time left from each stage's measured throughput (``ThroughputEta``), on a controlled clock."""

from __future__ import annotations

import math

import pytest

from cahp_engine.config import PruningConfig
from cahp_engine.errors import ConfigError
from cahp_engine.progress import ThroughputEta, skipped_stages, stage_costs, stage_spans

SPANS = {"load": (0.0, 0.1), "dense_finetune": (0.1, 0.5), "selection": (0.5, 0.6), "recovery": (0.6, 1.0)}
COSTS = {"load": 10.0, "dense_finetune": 100.0, "selection": 10.0, "recovery": 100.0}


def _overall(stage: str, fraction: float) -> float:
    lo, hi = SPANS[stage]
    return lo + (hi - lo) * fraction


def test_the_current_stage_goes_at_its_own_rate_and_later_ones_at_this_runs_measured_speed() -> None:
    eta = ThroughputEta(SPANS, COSTS)
    # Loading takes 20 s where the calibration took 10: that says nothing of the stages after it.
    assert eta.update(0.0, "load", _overall("load", 0.0)) is None  # nothing measured yet
    eta.update(20.0, "load", _overall("load", 1.0))
    # The first seconds of fine-tuning: nothing measured yet; the stages go at the calibration's speed.
    assert eta.update(20.0, "dense_finetune", _overall("dense_finetune", 0.0)) == pytest.approx(210)
    # Fine-tuning goes at 2 % a second (50 s in all, half its calibrated time): 45 s left of it, then
    # selection and recovery at its speed (x0.5), the fixed-cost selection included.
    for second in range(1, 6):
        left = eta.update(20.0 + second, "dense_finetune", _overall("dense_finetune", second / 50))
    assert left == pytest.approx(45 + 0.5 * 10 + 0.5 * 100)


# A 2,000-row job's shape: loading over in a quarter of its calibrated time (it reads files), every other
# stage at the same measured speed, the fixed-cost selection and export a real share of what is left.
JOB_SPANS = {"load": (0.0, 0.05), "dense_finetune": (0.05, 0.45), "selection": (0.45, 0.53),
             "recovery": (0.53, 0.93), "export": (0.93, 1.0)}
JOB_COSTS = {"load": 10.0, "dense_finetune": 100.0, "selection": 20.0, "recovery": 100.0, "export": 40.0}


def test_a_quick_loading_does_not_make_the_fixed_cost_stages_look_quick() -> None:
    """The time left is the time really left when every stage but loading runs at one speed.

    Loading took 2.5 s of its calibrated 10, the others 0.75 s per calibrated second (a 2,000-row SST-5
    job: 1.6 to 5.3 s of loading, the rest at 0.7 to 1.7). Taking the loading's speed for the selection
    and export foretold them at a third of their time until the selection had run.
    """
    eta = ThroughputEta(JOB_SPANS, JOB_COSTS)
    speed, now = 0.75, 2.5
    eta.update(0.0, "load", 0.0)
    eta.update(now, "load", JOB_SPANS["load"][1])
    end = now + speed * sum(cost for stage, cost in JOB_COSTS.items() if stage != "load")
    heard = 0
    for stage in ("dense_finetune", "selection", "recovery", "export"):
        lo, hi = JOB_SPANS[stage]
        seconds = speed * JOB_COSTS[stage]
        for tick in range(int(seconds) + 1):
            left = eta.update(now + tick, stage, lo + (hi - lo) * tick / seconds)
            if stage != "dense_finetune" or tick > 0:  # from the fine-tuning's first move on
                assert left == pytest.approx(end - now - tick), (stage, tick)
                heard += 1
        now += seconds
    assert heard > 150


def test_the_runs_speed_weighs_its_recent_seconds_more() -> None:
    memory = 240.0
    eta = ThroughputEta(SPANS, COSTS, memory_s=memory)
    eta.update(0.0, "load", 0.0)
    eta.update(10.0, "load", _overall("load", 1.0))
    # Half the fine-tuning at 2 s per calibrated second, then the other half at 1 (the machine freed).
    eta.update(10.0, "dense_finetune", _overall("dense_finetune", 0.0))
    eta.update(110.0, "dense_finetune", _overall("dense_finetune", 0.5))
    eta.update(160.0, "dense_finetune", _overall("dense_finetune", 1.0))
    left = eta.update(160.0, "selection", _overall("selection", 0.0))
    # The first half's seconds weigh exp(-50 / memory) of the second half's, which ended now.
    fade = math.exp(-50.0 / memory)
    speed = (100.0 * fade + 50.0) / (50.0 * fade + 50.0)
    assert left == pytest.approx(speed * (10 + 100))
    assert 1.0 < speed < 150.0 / 100.0  # nearer the machine as it is now than the average


def test_a_stage_slower_than_the_run_so_far_is_foretold_from_its_own_rate_as_much_as_it_is_done() -> None:
    eta = ThroughputEta(SPANS, COSTS, memory_s=math.inf)  # every measured second weighs the same
    now = 0.0
    for stage, seconds in (("load", 10.0), ("dense_finetune", 100.0), ("selection", 10.0)):
        eta.update(now, stage, _overall(stage, 0.0))
        now += seconds
        eta.update(now, stage, _overall(stage, 1.0))
    # Recovery goes at half its calibrated speed; fine-tuning and selection went at their calibrated speed.
    for second in range(0, 101):  # half of recovery in 100 s: 100 s left at its own rate
        left = eta.update(now + second, "recovery", _overall("recovery", second / 200))
    # Half done, its own rate weighs half; the other half is the run's speed so far, loading left out
    # (210 s for 160 calibrated s), on the 50 calibrated s left.
    assert left == pytest.approx(0.5 * 100 + 0.5 * (210 / 160) * 50)
    for second in range(101, 181):  # 90 % done: its own rate (20 s left) weighs 90 %
        left = eta.update(now + second, "recovery", _overall("recovery", second / 200))
    assert left == pytest.approx(0.9 * 20 + 0.1 * (290 / 200) * 10)


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
    """Loading as calibrated, recovery at twice its calibrated time; the export just begun (its time)."""
    eta = ThroughputEta(QUIET_SPANS, QUIET_COSTS, memory_s=math.inf)
    eta.update(0.0, "load", 0.0)
    eta.update(10.0, "load", 0.1)
    for second in range(0, 201):
        eta.update(10.0 + second, "recovery", 0.1 + 0.5 * second / 200)
    return eta, 210.0


def test_a_stage_that_reports_nothing_is_counted_down_from_its_expected_time() -> None:
    eta, now = _quiet_run_to_export()
    # The fixed-cost stages go at the run's speed, twice their calibration: 80 s of export, 20 of artifacts.
    assert eta.update(now, "export", 0.6) == pytest.approx(80 + 20)
    # Its silent seconds are neither a slower speed nor a frozen figure: the estimate counts down.
    assert eta.update(now + 30, "export", 0.6) == pytest.approx(100 - 30)
    assert eta.update(now + 60, "export", 0.6) == pytest.approx(100 - 60)


def test_a_silent_stage_past_its_expected_time_keeps_a_share_of_its_time_and_slows_the_stages_after_it() -> None:
    eta, now = _quiet_run_to_export()
    eta.update(now, "export", 0.6)
    # 160 s into an export expected to take 80: it is still running, so it does not say zero; the
    # run is now known to go at least (200 + 160) s per (100 + 40) calibrated s.
    left = eta.update(now + 160, "export", 0.6)
    speed = (200.0 + 160.0) / (100.0 + 40.0)
    assert left == pytest.approx(ThroughputEta.OVERRUN_SHARE * 160 + speed * 10)
    later = eta.update(now + 200, "export", 0.6)
    assert later is not None and later > left  # still not done: the longer it runs, the more is expected
    # Once it ends (a stage reports its end), the artifacts take the speed that export has shown.
    eta.update(now + 200, "export", 0.9)
    done = eta.update(now + 200, "artifacts", 0.9)
    assert done == pytest.approx((200.0 + 200.0) / (100.0 + 40.0) * 10)


def test_an_export_that_reports_its_steps_is_foretold_from_its_own_rate_as_a_reporting_stage_is() -> None:
    eta, now = _quiet_run_to_export()
    # The export takes 480 s, twelve times the calibrated 40 and six times what the run's speed
    # foretold, and reports its steps as it goes (one every 10 s).
    for second in range(0, 241, 10):
        left = eta.update(now + second, "export", 0.6 + 0.3 * second / 480)
    # Half done: its own rate over the last minute (240 s left) weighs half; the other half is the
    # run's speed measured so far, the export's included ((200 + 240) s for (100 + 20) calibrated s),
    # on its 20 calibrated s left, and the artifacts go at that speed too.
    speed = (200.0 + 240.0) / (100.0 + 20.0)
    assert left == pytest.approx(0.5 * 240 + 0.5 * speed * 20 + speed * 10)
    # Heard only at its start, the same export would be counted down from the run's speed before it.
    silent, _ = _quiet_run_to_export()
    silent.update(now, "export", 0.6)
    assert silent.update(now + 240, "export", 0.6) == pytest.approx(ThroughputEta.OVERRUN_SHARE * 240
                                                                      + (200.0 + 240.0) / (100.0 + 40.0) * 10)


@pytest.mark.parametrize("memory", [0.0, -60.0, math.nan])
def test_a_memory_that_is_not_a_positive_number_of_seconds_is_refused_saying_so(memory: float) -> None:
    # 0 would divide by zero at the first measured second, a negative one make old seconds weigh more.
    with pytest.raises(ConfigError, match=r"`memory_s` must be a number of seconds > 0 \(math.inf: no fading\)"):
        ThroughputEta(SPANS, COSTS, memory_s=memory)
