"""The export reports its steps: a real run's progress moves during it, and its time left is read from them.

One real run of ``run_pruning`` on a tiny model with the ONNX export and int8; its progress reports are
kept, then fed to :class:`~cahp_engine.progress.ThroughputEta` on a controlled clock.
"""

from __future__ import annotations

import pytest

from cahp_engine.config import PruningConfig
from cahp_engine.progress import StagePlan, ThroughputEta
from cahp_engine.run import RunHooks, RunRequest, run_pruning
from tests.support.helpers import write_tiny_dataset, write_tiny_model

CONFIG = PruningConfig(epochs=0.25, dense_finetune="never", untrained_dense="warn", batch_size=16, max_length=32,
                       seed=3, device="cpu", latency_warmup=1, latency_repeats=3, strategy="random", heads_to_keep=5,
                       export="onnx", quantize="int8")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("export-progress")
    model, data = write_tiny_model(root / "model"), write_tiny_dataset(root / "data", train=40, test=40)
    progress: list[tuple[str, float]] = []
    plans: list[StagePlan] = []
    run_pruning(RunRequest(model_ref=str(model), dataset_ref=str(data), output_dir=root / "out", config=CONFIG),
                RunHooks(progress=lambda stage, overall: progress.append((stage, overall)), plan=plans.append))
    assert len(plans) == 1
    return {"progress": progress, "plan": plans[0]}


def _export_reports(run: dict) -> list[float]:
    return [overall for stage, overall in run["progress"] if stage == "export"]


@pytest.mark.slow  # two ONNX exports, an int8 model and onnxruntime sessions
def test_the_export_reports_its_steps_as_increasing_fractions_of_its_span(run: dict) -> None:
    lo, hi = run["plan"].spans["export"]
    reports = _export_reports(run)
    assert reports[0] == pytest.approx(lo) and reports[-1] == pytest.approx(hi)
    within = sorted({overall for overall in reports if lo < overall < hi})
    # The graph written, its parity, its scoring, the int8 model, the dense graph, then a report per
    # latency pass (two batch sizes, one warm-up and three timed passes each).
    assert len(within) >= 10
    assert reports == sorted(reports)  # never back
    # The latency passes are the last steps, in rows: the batch-32 passes move it 32 times as far.
    steps = [b - a for a, b in zip(within[-8:], within[-7:], strict=False)]
    assert max(steps) == pytest.approx(32 * min(steps), rel=1e-6)


@pytest.mark.slow
def test_the_time_left_during_the_export_follows_the_rate_its_steps_show(run: dict) -> None:
    plan: StagePlan = run["plan"]
    lo, hi = plan.spans["export"]
    expected = plan.costs["export"]
    assert expected > 0 and plan.costs["artifacts"] > 0
    # The export runs at three times its calibrated time, evenly over its reported steps; nothing
    # before it measured the fixed-cost stages' speed, so they are foretold at the calibration's.
    slow = 3.0
    eta = ThroughputEta(plan.spans, plan.costs)
    start = 1000.0
    figures = []
    for overall in _export_reports(run):
        fraction = (overall - lo) / (hi - lo)
        left = eta.update(start + slow * expected * fraction, "export", overall)
        figures.append((fraction, left))
    assert figures[0][1] == pytest.approx(expected + plan.costs["artifacts"])  # nothing measured yet
    for fraction, left in figures[1:-1]:
        # Its own rate, and the speed it shows carried to the artifacts after it: the time really left.
        truth = slow * expected * (1.0 - fraction) + slow * plan.costs["artifacts"]
        assert left == pytest.approx(truth, rel=1e-6)

    # The same export heard only at its start (a stage that reports nothing while it works) is
    # counted down at the calibration's speed: halfway through its real time, it says much less.
    silent = ThroughputEta(plan.spans, plan.costs)
    silent.update(start, "export", lo)
    halfway = silent.update(start + slow * expected / 2, "export", lo)
    truth = slow * expected / 2 + slow * plan.costs["artifacts"]
    assert halfway is not None and halfway < 0.5 * truth
