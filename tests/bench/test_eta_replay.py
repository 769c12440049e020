"""``python -m bench eta --trace``: a recorded progress trace replayed through the estimators."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import common, eta
from cahp_engine.config import PruningConfig
from cahp_engine.progress import RowCounts, skipped_stages, stage_plan, stage_spans

CONFIG = PruningConfig(seed=0)
ROWS = RowCounts(train=10, evaluation=5)


def _trace(spans: dict[str, tuple[float, float]]) -> list[list[object]]:
    """A run whose stages take their place in the plan on its rows at a steady pace, 1 000 s in all, its
    progress reported in ``spans``."""
    plan = stage_plan(CONFIG, ROWS).spans
    trace: list[list[object]] = []
    for stage, (lo, hi) in plan.items():
        if hi <= lo:
            continue
        for step in range(11):
            at, (low, high) = lo + (hi - lo) * step / 10, spans[stage]
            trace.append([1000.0 * at, stage, low + (high - low) * step / 10])
    trace.append([1000.0, "done", 1.0])
    return trace


def _plan() -> dict[str, object]:
    plan = stage_plan(CONFIG, ROWS)
    return {"at_s": 1000.0 * plan.spans["load"][1], "spans": plan.spans, "costs": plan.costs}


def test_the_grid_hears_the_last_report_again_between_reports_and_counts_only_itself() -> None:
    trace = [(0.0, "load", 0.0), (12.0, "export", 0.5), (13.0, "artifacts", 0.9)]
    grid = eta._on_a_grid(trace, 5.0)
    assert [(now, stage, kept) for now, stage, _, kept in grid] == [
        (0.0, "load", False), (0.0, "load", True), (5.0, "load", True), (10.0, "load", True),
        (12.0, "export", False), (13.0, "artifacts", False)]


def _replay(tmp_path: Path, source: Path) -> dict:
    eta.main(["--trace", str(source), "--out", source.name + "-replay.json"])
    saved: dict = json.loads((tmp_path / "results" / (source.name + "-replay.json")).read_text())
    return saved


@pytest.mark.parametrize("partial", [False, True])
def test_a_replay_scores_each_stage_and_names_the_trace_it_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 partial: bool) -> None:
    monkeypatch.setattr(common, "RESULTS", tmp_path / "results")
    settings = {"rows": ROWS.train, "test_rows": ROWS.evaluation, "config": CONFIG.to_dict()}
    trace = _trace(stage_plan(CONFIG, ROWS).spans)
    source = tmp_path / ("run.json.partial" if partial else "run.json")
    if partial:  # what a stopped run leaves: its settings, then one report (or its plan) a line
        lines = [json.dumps(t) for t in trace]
        lines.insert(next(i for i, t in enumerate(trace) if t[1] != "load"), json.dumps({"plan": _plan()}))
        source.write_text("\n".join([json.dumps(settings), *lines]) + "\n")
    else:
        source.write_text(json.dumps({**settings, "plan": _plan(), "trace": trace, "timings_s": {}}))
    saved = _replay(tmp_path, source)
    assert saved["replayed"] == str(source) and saved["rows"] == ROWS.train and "trace" not in saved
    assert saved["plan_derived"] is False
    figures = saved["figures"]
    assert figures["wall_s"] == 1000.0
    # A sample every 5 s once the progress heard has reached 25 % (250 s of 1 000 here, heard a step
    # later at most), to the last second.
    scored = figures["throughput"]
    assert len(range(300, 1000, 5)) <= scored["samples_from_25pct"] <= len(range(250, 1000, 5))
    assert scored["null_from_25pct"] == 0
    assert sum(stage["samples"] for stage in scored["by_stage"].values()) == scored["samples_from_25pct"]
    assert {"recovery", "export"} <= set(scored["by_stage"])


def test_a_trace_recorded_without_a_plan_is_replayed_on_the_plan_its_rows_give(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same run, once reported in the calibration's spans (as runs were before they planned by their
    rows), once in its plan with the plan recorded: the replay moves the first onto the second."""
    monkeypatch.setattr(common, "RESULTS", tmp_path / "results")
    settings = {"rows": ROWS.train, "test_rows": ROWS.evaluation, "config": CONFIG.to_dict(), "timings_s": {}}
    old = tmp_path / "old.json"
    old.write_text(json.dumps({**settings, "trace": _trace(stage_spans(skipped_stages(CONFIG)))}))
    new = tmp_path / "new.json"
    new.write_text(json.dumps({**settings, "plan": _plan(), "trace": _trace(stage_plan(CONFIG, ROWS).spans)}))
    derived, recorded = _replay(tmp_path, old), _replay(tmp_path, new)
    assert derived["plan_derived"] is True and recorded["plan_derived"] is False
    for name in ("throughput", "fraction_pace"):
        mine, theirs = derived["figures"][name], recorded["figures"][name]
        assert mine["samples_from_25pct"] == theirs["samples_from_25pct"] > 0
        for key in ("median_error", "max_error", "within_25pct"):
            assert mine[key] == pytest.approx(theirs[key], abs=1e-3)


def test_a_stage_silenced_in_a_replay_is_heard_at_its_start_and_its_end_only() -> None:
    trace = [(0.0, "load", 0.0), (10.0, "export", 0.5), (20.0, "export", 0.6), (30.0, "export", 0.7),
             (40.0, "export", 0.9), (41.0, "artifacts", 0.9)]
    assert eta._silenced(trace, "export") == [trace[0], trace[1], trace[4], trace[5]]
    assert eta._silenced(trace, "teacher") == trace


def test_silencing_a_stage_without_a_trace_is_refused_before_any_work(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        eta.main(["--silent", "export", "--rows", "10"])
    assert stopped.value.code == 2
    assert "--silent replays a saved trace" in capsys.readouterr().err
