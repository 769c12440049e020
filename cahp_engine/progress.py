"""Progress, cancellation and stage timing shared by the long-running functions."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from cahp_engine.errors import JobCancelledError

#: ``progress(stage, fraction)``: ``fraction`` in [0, 1] of that stage.
ProgressFn = Callable[[str, float], None]
#: Polled between steps; True stops the run with :class:`JobCancelledError`.
CancelFn = Callable[[], bool]

#: Share of a whole pruning run each stage takes, roughly: ``run_pruning`` reports
#: ``lo + (hi - lo) * fraction`` as the overall progress, and progress bars map it back to the stage.
STAGE_SPAN: dict[str, tuple[float, float]] = {
    "load": (0.00, 0.02),
    "dense_finetune": (0.02, 0.25),
    "dense_evaluation": (0.25, 0.28),
    "signatures": (0.28, 0.40),
    "separation": (0.40, 0.41),
    "graph_space": (0.41, 0.42),
    "sweep": (0.42, 0.43),
    "knee": (0.43, 0.435),
    "salience": (0.435, 0.495),
    "stability": (0.495, 0.50),
    "selection": (0.50, 0.503),
    "surgery": (0.503, 0.505),
    "teacher": (0.505, 0.51),
    # An accuracy budget's candidates (screening recoveries); the chosen one's full recovery follows
    # as ``recovery``, whose span starts again at 0.51.
    "budget": (0.51, 0.88),
    "recovery": (0.51, 0.88),
    "evaluation": (0.88, 0.94),
    "export": (0.94, 0.98),
    "artifacts": (0.98, 1.00),
}


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
