"""How well a job's ``eta_s`` foretells the time it really has left, stage by stage.

The real all-MiniLM-L6-v2 (a new head, so ``dense_finetune: auto`` fine-tunes it) on ``--rows`` seeded
rows of SST-5's train split (``--test-rows`` of its test split), the engine's defaults otherwise (3 dense
epochs, 3 recovery epochs with distillation, ONNX export), through :func:`cahp_engine.run.run_pruning`
with a progress hook, as the job service's worker runs it. Every progress report is kept with its time
(the trace), and fed, as the worker feeds it, to :class:`cahp_engine.progress.ThroughputEta` (the
worker's estimate) and to the estimate it replaced (the overall fraction's pace over the last ten
minutes). Once the run has ended, each estimate is set against the time that was really left.

Reported: for each estimator, the relative error ``|eta - left| / left`` at 25, 50, 75 and 90 % of the
progress, its median and largest value from 25 % on, the share of samples within 25 %, each also by the
stage the run was in, and the first second at which it gave a figure; the stage timings. The samples are
taken every ``--grid`` seconds, the last report heard again in between (as the worker's keep-alive
does), so that each second of the run weighs the same; ``per_report`` scores the reports alone.
``--trace FILE`` replays a saved trace instead of running a job (the estimators are functions of the
trace alone); a run records its trace as it goes to ``<out>.partial``, which a stopped run leaves behind
to replay.

    OMP_NUM_THREADS=1 nice -n 5 python -m bench eta --data /work/shared/data/sst5 --rows 2000 --test-rows 400
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import common
from bench.common import SST5, minilm_path, pin_threads, save
from bench.resume import _subset

#: The estimate the worker gave before: the overall fraction's pace over this window (seconds).
OLD_WINDOW_S = 600.0
OLD_MIN_S = 30.0


def _old_eta(trace: list[tuple[float, str, float]]) -> list[float | None]:
    paces: list[tuple[float, float]] = []
    out: list[float | None] = []
    for now, _, overall in trace:
        paces.append((now, overall))
        while len(paces) > 2 and now - paces[1][0] >= OLD_WINDOW_S:
            paces.pop(0)
        then, before = paces[0]
        out.append(None if now - then < OLD_MIN_S or overall - before <= 1e-4
                   else (1.0 - overall) * (now - then) / (overall - before))
    return out


#: A trace's overall progress and the time the run moved to its :class:`StagePlan` on its rows.
Planned = tuple[float, Any]


def _new_eta(trace: list[tuple[float, str, float]], config: Any, planned: Planned) -> list[float | None]:
    """The worker's estimate at each report: on the plan without rows, then, from ``planned``'s time
    on (the end of loading), on the plan of the run's rows, as the worker hears it (``RunHooks.plan``)."""
    from cahp_engine.progress import ThroughputEta, stage_plan

    first = stage_plan(config)
    eta = ThroughputEta(first.spans, first.costs)
    at, plan = planned
    out: list[float | None] = []
    for now, stage, overall in trace:
        if plan is not None and now > at:
            eta.replan(plan)
            plan = None
        out.append(eta.update(now, stage, overall))
    return out


def _replanned(saved: dict[str, Any], config: Any) -> tuple[list[tuple[float, str, float]], Planned]:
    """A saved trace's reports and the plan its run moved to once loaded.

    A trace recorded before runs planned their stages by their rows (it has no ``plan``) was placed in the
    calibration's spans throughout: each report is moved to the span its stage has in the plan the run
    would have followed (:func:`~cahp_engine.progress.stage_plan` of its settings and its ``rows`` and
    ``test_rows``), at the same fraction of the stage, from the end of loading on.
    """
    from cahp_engine.progress import RowCounts, StagePlan, skipped_stages, stage_plan, stage_spans

    trace = [(float(now), str(stage), float(overall)) for now, stage, overall in saved["trace"]]
    if "plan" in saved:
        plan = StagePlan(spans={k: (lo, hi) for k, (lo, hi) in saved["plan"]["spans"].items()},
                         costs=saved["plan"]["costs"])
        return trace, (float(saved["plan"]["at_s"]), plan)
    recorded = stage_spans(skipped_stages(config))
    first = stage_plan(config)
    plan = stage_plan(config, RowCounts(train=int(saved["rows"]), evaluation=int(saved["test_rows"])))
    loaded = max((now for now, stage, _ in trace if stage == "load"), default=0.0)
    moved = []
    for now, stage, overall in trace:
        lo, hi = recorded.get(stage, (0.0, 0.0))
        if hi > lo:
            new_lo, new_hi = (first if stage == "load" else plan).spans[stage]
            overall = new_lo + (new_hi - new_lo) * min(1.0, max(0.0, (overall - lo) / (hi - lo)))
        moved.append((now, stage, overall))
    return moved, (loaded, plan)


def _silenced(trace: list[tuple[float, str, float]], stage: str) -> list[tuple[float, str, float]]:
    """``trace`` without ``stage``'s reports between its first and its last: the stage heard at its start
    and its end only."""
    mine = [i for i, (_, heard, _) in enumerate(trace) if heard == stage]
    inner = set(mine[1:-1])
    return [report for i, report in enumerate(trace) if i not in inner]


def _on_a_grid(trace: list[tuple[float, str, float]], every_s: float) -> list[tuple[float, str, float, bool]]:
    """The trace with, between its reports, the last one heard again every ``every_s`` seconds.

    That is what the worker does: it writes the estimate on each report (at most every 2 s) and on its
    keep-alive ticks while a stage reports nothing (a teacher pass, an export's graph being written), and a
    client may read it at any time. A grid sample is flagged True; the score counts only those, so each
    second of the run weighs the same whichever stage it falls in (a fine-tuning reports every step, a
    teacher pass twice).
    """
    out: list[tuple[float, str, float, bool]] = []
    tick = 0.0
    last: tuple[str, float] | None = None
    for now, stage, overall in trace:
        while last is not None and tick < now:
            out.append((tick, *last, True))
            tick += every_s
        out.append((now, stage, overall, False))
        last = (stage, overall)
        tick = max(tick, now)
    return out


def _score(trace: list[tuple[float, str, float]], etas: list[float | None],
           grid: list[bool] | None = None) -> dict[str, Any]:
    end = trace[-1][0]
    counted = grid or [True] * len(trace)
    rows = [(overall, eta, end - now, now, stage)
            for (now, stage, overall), eta, keep in zip(trace, etas, counted, strict=True) if keep]
    first = next((now for _, eta, _, now, _ in rows if eta is not None), None)
    late = [(stage, abs(eta - left) / left) for overall, eta, left, _, stage in rows
            if eta is not None and overall >= 0.25 and left > 1.0]
    at = {}
    for mark in (0.25, 0.5, 0.75, 0.9):
        hit = next(((eta, left) for overall, eta, left, _, _ in rows if overall >= mark and eta is not None), None)
        at[f"{mark:.0%}"] = None if hit is None else {"eta_s": round(hit[0], 1), "left_s": round(hit[1], 1),
                                                      "error": round(abs(hit[0] - hit[1]) / hit[1], 3)}
    missing = sum(1 for overall, eta, _, _, _ in rows if eta is None and overall >= 0.25)
    by_stage: dict[str, list[float]] = {}
    for stage, error in late:
        by_stage.setdefault(stage, []).append(error)
    return {"first_estimate_at_s": first, "at": at, "samples_from_25pct": len(late), "null_from_25pct": missing,
            **_summary([e for _, e in late]),
            "by_stage": {stage: {"samples": len(errors), **_summary(errors)} for stage, errors in by_stage.items()}}


def _summary(errors: list[float]) -> dict[str, float | None]:
    if not errors:
        return {"median_error": None, "max_error": None, "within_25pct": None}
    return {"median_error": round(statistics.median(errors), 3), "max_error": round(max(errors), 3),
            "within_25pct": round(sum(e <= 0.25 for e in errors) / len(errors), 3)}


def _figures(trace: list[tuple[float, str, float]], config: Any, every_s: float,
             planned: Planned) -> dict[str, Any]:
    """Both estimators scored on the grid (each second weighs the same) and on the reports alone."""
    dense = _on_a_grid(trace, every_s)
    replay = [(now, stage, overall) for now, stage, overall, _ in dense]
    grid = [keep for *_, keep in dense]
    return {"wall_s": round(trace[-1][0], 1), "grid_s": every_s,
            "throughput": _score(replay, _new_eta(replay, config, planned), grid),
            "fraction_pace": _score(replay, _old_eta(replay), grid),
            "per_report": {"throughput": _score(trace, _new_eta(trace, config, planned)),
                           "fraction_pace": _score(trace, _old_eta(trace))}}


def _load_trace(path: Path) -> dict[str, Any]:
    text = path.read_text()
    if path.suffix == ".partial":  # a run stopped early: its settings, then one report a line
        first, *lines = text.splitlines()
        heard = [json.loads(line) for line in lines]
        plans = [line for line in heard if isinstance(line, dict)]  # the plan, heard once loaded
        return {**json.loads(first), **(plans[-1] if plans else {}),
                "trace": [line for line in heard if not isinstance(line, dict)]}
    saved: dict[str, Any] = json.loads(text)
    return saved


def _record(args: argparse.Namespace) -> tuple[dict[str, Any], Any, dict[str, float]]:
    """Run the job, keeping every progress report with its time and the plan it moved to once loaded;
    also appended, as they come, to ``<out>.partial`` under bench/results/, so that a run stopped early
    leaves its trace to replay."""
    from cahp_engine.config import PruningConfig
    from cahp_engine.progress import StagePlan
    from cahp_engine.run import RunHooks, RunRequest, run_pruning

    config = PruningConfig(epochs=args.epochs, dense_epochs=args.epochs, seed=0)
    trace: list[tuple[float, str, float]] = []
    partial = common.RESULTS / (args.out + ".partial")
    common.RESULTS.mkdir(parents=True, exist_ok=True)
    partial.write_text(json.dumps({"rows": args.rows, "test_rows": args.test_rows, "threads": args.threads,
                                   "config": config.to_dict()}) + "\n")
    with tempfile.TemporaryDirectory(prefix="cahp-bench-eta-") as tmp:
        root = Path(tmp)
        data = str(_subset(args.data, root / "data", args.rows, args.test_rows))
        started = time.monotonic()

        def heard(stage: str, overall: float) -> None:
            trace.append((time.monotonic() - started, stage, overall))
            with partial.open("a") as handle:
                handle.write(json.dumps(trace[-1]) + "\n")

        def planned(plan: StagePlan) -> None:
            recorded["plan"] = {"at_s": time.monotonic() - started, "spans": plan.spans, "costs": plan.costs}
            with partial.open("a") as handle:
                handle.write(json.dumps(recorded) + "\n")

        recorded: dict[str, Any] = {}
        report = run_pruning(RunRequest(minilm_path(), data, root / "out", config),
                             RunHooks(progress=heard, plan=planned))
        trace.append((time.monotonic() - started, "done", 1.0))
    partial.unlink()
    return {**recorded, "trace": [list(t) for t in trace]}, config, dict(report.timings_s)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench eta", description=__doc__.splitlines()[0],
                                     allow_abbrev=False)
    parser.add_argument("--data", type=Path, default=SST5, help="SST-5 directory (train.csv, test.csv)")
    parser.add_argument("--rows", type=int, default=2000, help="training rows (default 2000)")
    parser.add_argument("--test-rows", type=int, default=400, help="test rows (default 400)")
    parser.add_argument("--epochs", type=float, default=3.0, help="recovery and dense epochs (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--trace", type=Path,
                        help="replay this saved trace (a bench/results/eta*.json, or the .partial of a run stopped "
                             "early) instead")
    parser.add_argument("--silent", metavar="STAGE",
                        help="with --trace: drop STAGE's reports between its first and its last, as a stage that "
                             "reports nothing while it works is heard (the export before it reported its steps)")
    parser.add_argument("--grid", type=float, default=5.0,
                        help="seconds between the samples scored, the last report heard again (default 5)")
    parser.add_argument("--out", default="eta.json", help="results file name under bench/results/")
    args = parser.parse_args(argv)
    if args.silent is not None and args.trace is None:
        parser.error("--silent replays a saved trace: give it with --trace FILE (a new run records every report)")
    pin_threads(args.threads)

    from cahp_engine.config import PruningConfig

    if args.trace is not None:
        saved = _load_trace(args.trace)
        config = PruningConfig(**saved["config"])
        # A replay keeps the recorded run's facts and names its trace rather than copying it.
        payload = {key: saved.get(key) for key in ("rows", "test_rows", "threads", "timings_s")}
        payload |= {"replayed": str(args.trace), "recorded_at": saved.get("date"),
                    "recorded_on": saved.get("machine"), "config": config.to_dict(),
                    "plan_derived": "plan" not in saved, "silent": args.silent}
    else:
        saved, config, timings = _record(args)
        payload = {"rows": args.rows, "test_rows": args.test_rows, "threads": args.threads,
                   "config": config.to_dict(), "timings_s": timings, **saved}
    trace, planned = _replanned(saved, config)
    if args.silent is not None:
        trace = _silenced(trace, args.silent)
    figures = _figures(trace, config, args.grid, planned)
    payload["figures"] = figures
    path = save(args.out, payload, command="python -m bench eta " + " ".join(argv or []),
                protocol=__doc__.split("\n\n")[1])
    print(json.dumps({**figures, "timings_s": payload["timings_s"]}, indent=2))
    print(f"saved {path}")


if __name__ == "__main__":
    main()
