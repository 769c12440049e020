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
