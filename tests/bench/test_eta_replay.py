"""``python -m bench eta --trace``: a recorded progress trace replayed through the estimators."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import common, eta
from cahp_engine.config import PruningConfig
from cahp_engine.progress import stage_spans


def _trace() -> list[list[object]]:
    """A run whose stages take their place in the spans at a steady pace, 1 000 s in all."""
    spans = stage_spans(("budget", "reconstruction"))
    trace: list[list[object]] = []
    for stage, (lo, hi) in spans.items():
        if hi <= lo:
            continue
        for step in range(11):
            overall = lo + (hi - lo) * step / 10
            trace.append([1000.0 * overall, stage, overall])
    trace.append([1000.0, "done", 1.0])
    return trace


def test_the_grid_hears_the_last_report_again_between_reports_and_counts_only_itself() -> None:
    trace = [(0.0, "load", 0.0), (12.0, "export", 0.5), (13.0, "artifacts", 0.9)]
    grid = eta._on_a_grid(trace, 5.0)
    assert [(now, stage, kept) for now, stage, _, kept in grid] == [
        (0.0, "load", False), (0.0, "load", True), (5.0, "load", True), (10.0, "load", True),
        (12.0, "export", False), (13.0, "artifacts", False)]


@pytest.mark.parametrize("partial", [False, True])
def test_a_replay_scores_each_stage_and_names_the_trace_it_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 partial: bool) -> None:
    monkeypatch.setattr(common, "RESULTS", tmp_path / "results")
    config = PruningConfig(seed=0).to_dict()
    source = tmp_path / ("run.json.partial" if partial else "run.json")
    if partial:  # what a stopped run leaves: its settings, then one report a line
        source.write_text("\n".join([json.dumps({"rows": 10, "config": config}),
                                     *(json.dumps(t) for t in _trace())]) + "\n")
    else:
        source.write_text(json.dumps({"rows": 10, "config": config, "trace": _trace(), "timings_s": {}}))
    eta.main(["--trace", str(source), "--out", "replay.json"])
    saved = json.loads((tmp_path / "results" / "replay.json").read_text())
    assert saved["replayed"] == str(source) and saved["rows"] == 10 and "trace" not in saved
    figures = saved["figures"]
    assert figures["wall_s"] == 1000.0
    # A sample every 5 s once the progress heard has reached 25 % (250 s of 1 000 here, heard a step
    # later at most), to the last second.
    scored = figures["throughput"]
    assert len(range(300, 1000, 5)) <= scored["samples_from_25pct"] <= len(range(250, 1000, 5))
    assert scored["null_from_25pct"] == 0
    assert sum(stage["samples"] for stage in scored["by_stage"].values()) == scored["samples_from_25pct"]
    assert {"recovery", "export"} <= set(scored["by_stage"])
