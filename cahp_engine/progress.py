"""Progress, cancellation and stage timing shared by the long-running functions."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import Any

from cahp_engine.errors import JobCancelledError

#: ``progress(stage, fraction)``: ``fraction`` in [0, 1] of that stage.
ProgressFn = Callable[[str, float], None]
#: Polled between steps; True stops the run with :class:`JobCancelledError`.
CancelFn = Callable[[], bool]

#: What each stage cost in one measured job, in seconds: all-MiniLM-L6-v2 on SST-5's 8,544 training rows,
#: 1 CPU thread, dense fine-tuning 3 epochs, selection at the stopping rules, 3 recovery epochs with
#: distillation, ONNX export (docs/performance.md, "One whole job on all-MiniLM-L6-v2 + SST-5"; the dense
#: fine-tuning as timed in the same setting). An accuracy budget's candidates are counted as one more recovery.
STAGE_COST: dict[str, float] = {
    "load": 10.0,
    "dense_finetune": 960.0,
    "dense_evaluation": 25.0,
    "signatures": 19.1,
    "separation": 0.3,
    "graph_space": 0.4,
    "sweep": 0.2,
    "knee": 0.1,
    "salience": 24.4,
    "stability": 5.1,
    "selection": 0.5,
    "teacher": 142.2,
    "surgery": 1.0,
    "pruned_evaluation": 25.0,
    "reconstruction": 30.0,
    "budget": 975.0,
    "recovery": 974.6,
    "evaluation": 60.0,
    "export": 120.7,
    "artifacts": 5.0,
}


def stage_spans(skip: Collection[str] = ("budget",)) -> dict[str, tuple[float, float]]:
    """Each stage's share of a run that skips the stages ``skip``, in proportion to :data:`STAGE_COST`.

    A skipped stage keeps a span of width zero where it would be, so a run that reports it anyway
    moves nothing.
    """
    costs = {stage: (0.0 if stage in skip else cost) for stage, cost in STAGE_COST.items()}
    total = sum(costs.values()) or 1.0
    spans, at = {}, 0.0
    for stage, cost in costs.items():
        spans[stage] = (at / total, (at + cost) / total)
        at += cost
    return spans


def skipped_stages(config: Any) -> tuple[str, ...]:
    """The stages a run with ``config`` (a :class:`~cahp_engine.config.PruningConfig`) does not run.

    Dense fine-tuning counts as run unless it is ``never`` (``auto`` decides after loading the model).
    """
    skip = []
    if config.dense_finetune == "never":
        skip.append("dense_finetune")
    recovery = getattr(config, "recovery", "finetune")
    if config.recovery_loss != "distill" or recovery == "reconstruct":
        skip.append("teacher")
    if recovery == "finetune":
        skip.append("reconstruction")
    if recovery == "reconstruct":
        skip.append("recovery")
    if config.max_accuracy_drop is None:
        skip.append("budget")
    if config.export == "none":
        skip.append("export")
    return tuple(skip)


#: The share of a whole pruning run each stage takes, in the order the stages run, in proportion to
#: :data:`STAGE_COST`, for a run without an accuracy budget (:func:`stage_spans` for another run):
#: ``run_pruning`` reports ``lo + (hi - lo) * fraction`` as the overall progress (through
#: :class:`RunProgress`, which never lets it go back), and progress bars map it back to the stage. A stage
#: that does not run after all (dense fine-tuning of a trained classifier under ``auto``) is passed over:
#: progress jumps forward its span.
STAGE_SPAN: dict[str, tuple[float, float]] = stage_spans()


class RunProgress:
    """A run's overall progress from its stages' own: each stage placed in its span, never decreasing.

    ``report(stage, overall)`` hears every change. A stage reported again later (the dense model scored
    on a validation split after selection, say) or not in ``spans`` stays where the run is; so within one
    run (one attempt of a job) the overall progress only grows.
    """

    def __init__(self, report: ProgressFn | None, spans: dict[str, tuple[float, float]] = STAGE_SPAN) -> None:
        self._report = report
        self._spans = spans
        self.overall = 0.0

    def __call__(self, stage: str, fraction: float) -> None:
        lo, hi = self._spans.get(stage, (self.overall, self.overall))
        self.overall = max(self.overall, lo + (hi - lo) * min(1.0, max(0.0, fraction)))
        if self._report is not None:
            self._report(stage, self.overall)


class Monitor:
    """Bundles the optional progress and cancellation callbacks with a per-stage wall clock."""

    def __init__(self, progress: ProgressFn | None = None, should_cancel: CancelFn | None = None) -> None:
        self._progress = progress
        self._should_cancel = should_cancel
        self.timings: dict[str, float] = {}

    def check(self) -> None:
        """Raise :class:`JobCancelledError` if cancellation was requested."""
        if self._should_cancel is not None and self._should_cancel():
            raise JobCancelledError("the run was cancelled")

    def report(self, stage: str, fraction: float) -> None:
        if self._progress is not None:
            self._progress(stage, min(1.0, max(0.0, fraction)))

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time a stage (accumulating if it runs more than once) and report its start and end."""
        self.check()
        self.report(name, 0.0)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - start
        self.report(name, 1.0)

    def counter(self, stage: str, total: int) -> Callable[[int], None]:
        """A callback that adds its argument to a running count, reports and checks cancellation."""
        done = [0]

        def step(amount: int) -> None:
            done[0] += amount
            self.report(stage, done[0] / max(total, 1))
            self.check()

        return step
