"""What a run says while it works: a log line at least every half minute of a long stage.

A job that trains for an hour must not be silent for an hour: its log is how a user tells a slow job
from a hung one. :class:`LiveLog` sits on the run's progress reports; once ``interval_s`` passed
since its last line it writes where the stage is. A fine-tuning (dense or recovery) says its epoch,
step, running loss, pace in rows per second, the time its stage still needs and, when it watches a
validation split, the last validation score::

    recovery: epoch 1.42 of 3, step 381/804, loss 0.8123, 41.2 rows/s, about 5 min left in this stage
    signatures: 60% of the stage after 31 s
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from cahp_engine.recovery import FineTuning

#: Longest silence of a long stage's log, in seconds.
LOG_INTERVAL_S = 30.0


class TrainingHooks(Protocol):
    """What a run's fine-tunings are given: a saved state to go on from, and a call at each stop.

    :class:`~cahp_engine.run._resume.Resumer` is the run's; ``stage`` is the fine-tuning's
    progress stage (``dense_finetune``, ``recovery``).
    """

    def resume(self, stage: str) -> Mapping[str, Any] | None: ...

    def on_stop(self, stage: str) -> Callable[[FineTuning], None]: ...


class LiveLog:
    """Writes a line through ``say`` when ``interval_s`` passed since the last one, from the run's progress."""

    def __init__(self, say: Callable[[str], None], *, interval_s: float = LOG_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._say = say
        self._interval = interval_s
        self._clock = clock
        self._stage: str | None = None
        self._stage_started = self._last = clock()
        self._tunings: dict[str, tuple[FineTuning, int, float]] = {}

    def watch(self, stage: str, tuning: FineTuning) -> None:
        """Report ``tuning``'s own figures for ``stage`` (kept while the same fine-tuning goes on)."""
        known = self._tunings.get(stage)
        if known is None or known[0] is not tuning:
            self._tunings[stage] = (tuning, tuning.step, self._clock())

    def progress(self, stage: str, fraction: float) -> None:
        """Hear a stage's progress (``fraction`` of the stage); say where it is when it is time."""
        now = self._clock()
        if stage != self._stage:
            self._stage, self._stage_started, self._last = stage, now, now
            return
        if now - self._last >= self._interval:
            self._last = now
            self._say(self.line(stage, fraction, now))

    def line(self, stage: str, fraction: float, now: float) -> str:
        """The line for ``stage`` now."""
        watched = self._tunings.get(stage)
        if watched is None:
            return f"{stage}: {fraction:.0%} of the stage after {now - self._stage_started:.0f} s"
        tuning, first_step, since = watched
        steps, elapsed = tuning.step - first_step, max(now - since, 1e-9)
        rate = steps / elapsed
        epochs = tuning.total / tuning.batches_per_epoch
        text = f"{stage}: epoch {tuning.epoch:.2f} of {epochs:g}, step {tuning.step}/{tuning.total}"
        losses = tuning.result().loss_per_epoch
        if losses:
            text += f", loss {losses[-1]:.4f}"
        text += f", {rate * tuning.batch_size:.1f} rows/s"
        if rate > 0:
            text += f", about {_duration((tuning.total - tuning.step) / rate)} left in this stage"
        validation = tuning.result().validation
        if validation:
            text += f", validation score {validation[-1].score:.4f} at epoch {validation[-1].epoch:.2f}"
        return text


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = seconds / 60
    return f"{minutes:.0f} min" if minutes < 90 else f"{minutes / 60:.1f} h"
