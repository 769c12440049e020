"""A run's stages placed by its own rows (``stage_plan``), the progress that moves to them, and the time
left that follows them, on a controlled clock."""

from __future__ import annotations

import pytest

from cahp_engine.config import PruningConfig
from cahp_engine.progress import (
    CALIBRATION_ROWS,
    EVALUATION_ROW_STAGES,
    TRAIN_ROW_STAGES,
    RowCounts,
    RunProgress,
    ThroughputEta,
    stage_costs,
    stage_plan,
)

CONFIG = PruningConfig(epochs=3, dense_epochs=3, dense_finetune="always", export="onnx")
#: A quarter of the calibration's training rows, twice its evaluation rows.
ROWS = RowCounts(train=CALIBRATION_ROWS.train // 4, evaluation=CALIBRATION_ROWS.evaluation * 2)


def test_the_row_bound_stages_cost_in_proportion_to_the_rows_and_the_others_as_calibrated() -> None:
    calibrated, mine = stage_costs(CONFIG), stage_costs(CONFIG, ROWS)
    assert stage_costs(CONFIG, CALIBRATION_ROWS) == pytest.approx(calibrated)
    for stage, cost in calibrated.items():
        if stage in TRAIN_ROW_STAGES:
            assert mine[stage] == pytest.approx(cost * ROWS.train / CALIBRATION_ROWS.train)
        elif stage in EVALUATION_ROW_STAGES:
            assert mine[stage] == pytest.approx(cost * ROWS.evaluation / CALIBRATION_ROWS.evaluation)
        else:  # loading, selection, export: not the rows' to scale
            assert mine[stage] == cost
    assert mine["dense_finetune"] > 0 and mine["signatures"] == calibrated["signatures"] > 0


def _width(spans: dict[str, tuple[float, float]], stage: str) -> float:
    return spans[stage][1] - spans[stage][0]


def test_the_plan_keeps_the_loading_span_and_shares_the_rest_by_the_costs_on_the_rows() -> None:
    before, after = stage_plan(CONFIG), stage_plan(CONFIG, ROWS)
    assert after.spans["load"] == before.spans["load"]
    assert after.costs == stage_costs(CONFIG, ROWS)
    # One stage after another, from 0 to 1, none overlapping.
    edges = list(after.spans.values())
    assert edges[0][0] == 0.0 and edges[-1][1] == pytest.approx(1.0)
    assert all(hi == pytest.approx(lo) for (_, hi), (lo, _) in zip(edges, edges[1:], strict=False))
    # After loading, each stage's share is its cost's share of the costs still to come.
    rest = sum(cost for stage, cost in after.costs.items() if stage != "load")
    for stage in ("dense_finetune", "signatures", "recovery", "export"):
        assert _width(after.spans, stage) / (1.0 - after.spans["load"][1]) == pytest.approx(after.costs[stage] / rest)
    # A quarter of the rows: the fine-tunings take less of the run, the fixed stages more.
    assert _width(after.spans, "dense_finetune") < _width(before.spans, "dense_finetune")
    assert _width(after.spans, "export") > _width(before.spans, "export")


def test_progress_moved_to_the_plan_on_the_rows_never_goes_back() -> None:
    heard: list[float] = []
    before, after = stage_plan(CONFIG), stage_plan(CONFIG, RowCounts(train=CALIBRATION_ROWS.train * 4,
                                                                      evaluation=CALIBRATION_ROWS.evaluation))
    placed = RunProgress(lambda _stage, overall: heard.append(overall), before.spans)
    placed("load", 0.0)
    placed("load", 1.0)
    placed.replan(after.spans)
    for stage in ("dense_finetune", "dense_evaluation", "signatures"):
        for fraction in (0.0, 0.5, 1.0):
            placed(stage, fraction)
    assert heard == sorted(heard)
    # From loading's end on, each stage is where the new plan puts it.
    assert heard[2] == heard[1] == after.spans["dense_finetune"][0]
    assert heard[-1] == pytest.approx(after.spans["signatures"][1])
    # A stage the new plan places behind the progress reached (a plan heard late) holds the progress.
    placed.replan(before.spans)
    placed("signatures", 1.0)
    assert heard[-1] == heard[-2]


def test_the_time_left_follows_the_plan_on_the_rows_from_when_it_is_heard() -> None:
    first, plan = stage_plan(CONFIG), stage_plan(CONFIG, ROWS)
    eta = ThroughputEta(first.spans, first.costs)
    eta.update(0.0, "load", 0.0)
    # Loading over (its time says nothing of the stages after it): until one of them is measured, they
    # go at the calibration's speed, 1 s per calibrated second.
    before = eta.update(first.costs["load"], "load", first.spans["load"][1])
    assert before == pytest.approx(sum(cost for stage, cost in first.costs.items() if stage != "load"))
    eta.replan(plan)  # heard as loading ends, as the engine tells it
    after = eta.update(first.costs["load"], "dense_finetune", plan.spans["dense_finetune"][0])
    assert after == pytest.approx(sum(cost for stage, cost in plan.costs.items() if stage != "load"))
    # Half the dense fine-tuning in the time the plan gives it: the same speed, half of it left.
    now = first.costs["load"] + plan.costs["dense_finetune"] / 2
    lo, hi = plan.spans["dense_finetune"]
    left = eta.update(now, "dense_finetune", lo + (hi - lo) / 2)
    assert left == pytest.approx(after - plan.costs["dense_finetune"] / 2)
