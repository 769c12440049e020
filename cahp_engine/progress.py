"""Progress, cancellation and stage timing shared by the long-running functions."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from cahp_engine.errors import ConfigError, JobCancelledError

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


def stage_spans(skip: Collection[str] = ("budget",),
                costs: dict[str, float] | None = None) -> dict[str, tuple[float, float]]:
    """Each stage's share of a run that skips the stages ``skip``, in proportion to ``costs`` (by default
    :data:`STAGE_COST`; a stage ``costs`` leaves out costs nothing).

    A skipped stage keeps a span of width zero where it would be, so a run that reports it anyway
    moves nothing.
    """
    given = STAGE_COST if costs is None else costs
    costs = {stage: (0.0 if stage in skip else given.get(stage, 0.0)) for stage in STAGE_COST}
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

    def replan(self, spans: dict[str, tuple[float, float]]) -> None:
        """Place the stages still to come in ``spans`` from now on (:func:`stage_plan` once the rows are
        known); what was reported stays, and the progress still never goes back."""
        self._spans = spans

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


#: Stages whose seconds say nothing of the run's speed on the work after them: loading reads files (or
#: downloads them) and computes little. A 2,000-row SST-5 job loads in 1.6 to 5.3 s where the calibration
#: took 10, while its fine-tunings and selection run at 0.7 to 1.7 s per calibrated second
#: (``bench/results/eta-sst5-2000*.json``).
UNTIMED_STAGES = frozenset({"load"})


#: The export's share of :data:`STAGE_COST`'s ``export`` when it makes no int8 model (the calibration job
#: quantized, scored and timed one as well): a 2,000-row SST-5 job's ONNX export took 76.1 s at the 1.32 s
#: per calibrated second its other fixed-cost stages ran at, 57.5 calibrated seconds of 120.7
#: (``bench/results/eta-sst5-2000.json``, docs/performance.md, "The time left").
EXPORT_SHARE_WITHOUT_INT8 = 0.48


@dataclass(frozen=True)
class RowCounts:
    """The rows a run's row-bound stages go through, known once its data is loaded.

    ``train``: the rows the fine-tunings and the teacher pass go through (the training split, less any
    validation rows carved from it); ``evaluation``: the rows each evaluation scores.
    """

    train: int
    evaluation: int


#: The rows of the job :data:`STAGE_COST` was measured on: SST-5's training and test splits.
CALIBRATION_ROWS = RowCounts(train=8544, evaluation=2210)
#: The stages whose cost grows with the training rows, and with the evaluation rows. The selection's
#: stages are not among them: under the stopping rules they decide how many rows to profile as they go
#: (1,152 to 8,544 of SST-5's, docs/performance.md), so they keep their calibrated cost.
TRAIN_ROW_STAGES = frozenset({"dense_finetune", "teacher", "budget", "recovery"})
EVALUATION_ROW_STAGES = frozenset({"dense_evaluation", "pruned_evaluation", "evaluation"})


def stage_costs(config: Any, rows: RowCounts | None = None) -> dict[str, float]:
    """:data:`STAGE_COST` for a run with ``config`` on ``rows``: skipped stages at 0, the fine-tunings by
    their epochs, the row-bound stages by their rows.

    The calibration job trained 3 epochs of each; a run of 1 recovery epoch expects a third of its cost.
    An export without int8 expects :data:`EXPORT_SHARE_WITHOUT_INT8` of the calibrated one. A run on
    2,000 training rows expects 2,000 / 8,544 of each calibrated fine-tuning and teacher pass
    (:data:`CALIBRATION_ROWS`); without ``rows``, the calibration's.
    """
    skip = set(skipped_stages(config))
    costs = {stage: (0.0 if stage in skip else cost) for stage, cost in STAGE_COST.items()}
    costs["dense_finetune"] *= float(config.dense_epochs) / 3.0
    costs["recovery"] *= float(config.epochs) / 3.0
    costs["budget"] *= float(config.epochs) / 3.0
    if getattr(config, "quantize", "none") != "int8":
        costs["export"] *= EXPORT_SHARE_WITHOUT_INT8
    if rows is not None:
        for stage in TRAIN_ROW_STAGES:
            costs[stage] *= rows.train / CALIBRATION_ROWS.train
        for stage in EVALUATION_ROW_STAGES:
            costs[stage] *= rows.evaluation / CALIBRATION_ROWS.evaluation
    return costs


@dataclass(frozen=True)
class StagePlan:
    """Where a run places its stages in its overall progress (``spans``) and what each is expected to
    cost, in calibrated seconds (``costs``): :func:`stage_plan`."""

    spans: dict[str, tuple[float, float]]
    costs: dict[str, float]


def stage_plan(config: Any, rows: RowCounts | None = None) -> StagePlan:
    """The stages of a run with ``config``, in proportion to their expected costs (:func:`stage_costs`).

    A run starts on the plan without ``rows`` (the calibration's proportions); once its data is loaded
    it knows its rows and moves to the plan with them, in which loading keeps the span it had (it is
    over by then) and the stages after it share the rest in proportion to their costs on those rows.
    So the progress reported never goes back, and on a 2,000-row job the dense fine-tuning takes the
    share of the run it really takes rather than an 8,544-row job's.
    """
    costs = stage_costs(config, rows)
    skip = skipped_stages(config)
    _, loaded = stage_spans(skip, stage_costs(config))["load"]
    rest = stage_spans((*skip, "load"), costs)
    spans = {stage: (loaded + (1.0 - loaded) * lo, loaded + (1.0 - loaded) * hi) for stage, (lo, hi) in rest.items()}
    spans["load"] = (0.0, loaded)
    return StagePlan(spans={stage: spans[stage] for stage in STAGE_COST}, costs=costs)


class ThroughputEta:
    """Seconds a run still needs, from the speed measured in its own stages so far.

    Each stage still to come takes its calibrated cost (:func:`stage_costs`, on the run's rows once its
    :class:`StagePlan` is heard) times the run's speed: seconds spent per second of calibrated cost, over
    every stage measured so far but loading (:data:`UNTIMED_STAGES`), the recent seconds weighing more
    (each measured second by ``exp(-age / memory_s)``: a shared machine's speed drifts over minutes, and
    the next stages run on the machine as it is now). All the stages share one speed: with the costs on
    the run's own rows, a row-bound stage's seconds per calibrated second measure the machine as a
    fixed-cost stage's do, and the fine-tunings measure it over minutes where the selection's stages
    take seconds. Until something is measured (loading just over), the stages go at the calibration's
    speed.

    The current stage's time left is its fraction left at that speed, blended with its own rate over the
    last ``window_s`` (for a fine-tuning, the rows per second of the current epoch) in proportion to the
    share of the stage done: its first minute does not outweigh what the run has shown, its last ones are
    its own (the export reports its steps, the latency rounds as they go). A stage that reports nothing
    while it works (a teacher pass, an export's graph being written) is counted down as its seconds pass.
    Its silent seconds say nothing of its speed until they pass what it was expected to take; from then on
    the run's speed is at least its seconds over its calibrated cost, which the stages after it take, and
    the stage itself is given :attr:`OVERRUN_SHARE` of its silent time again rather than a figure that
    runs out. A stage the spans do not place (a validation pass) counts the last estimate down rather than
    freezing it. No estimate until the run has moved (a loading that has reported no progress yet gives
    none); from its first move, the calibration's speed until a stage after loading is measured.

    Parameters
    ----------
    spans : dict of str to (float, float)
        Where each stage sits in the overall progress (:func:`stage_spans` of the run's skipped stages):
        the progress the engine reports maps back to the stage's own fraction.
    costs : dict of str to float
        The calibrated seconds of each stage (:func:`stage_costs`).
    window_s : float
        How much of the current stage's recent past its rate is measured over.
    memory_s : float > 0
        How fast the run's measured seconds fade from its speed (``math.inf``: all weigh the same).
    """

    #: The current stage's own rate is trusted once measured over this many seconds.
    MIN_RATE_S = 5.0
    #: A stage silent past its expected time is given this share of its silent time again.
    OVERRUN_SHARE = 0.25

    def __init__(self, spans: dict[str, tuple[float, float]], costs: dict[str, float], *,
                 window_s: float = 60.0, memory_s: float = 240.0) -> None:
        if not memory_s > 0:  # also NaN
            raise ConfigError(f"`memory_s` must be a number of seconds > 0 (math.inf: no fading), got {memory_s!r}")
        self._spans = spans
        self._costs = costs
        self._window = window_s
        self._memory = memory_s
        self._spent = 0.0  # seconds measured, each weighed by its age
        self._covered = 0.0  # calibrated seconds of work those seconds did, weighed alike
        self._heard = 0.0  # when they were last added to
        self._moving = False  # whether the run has moved yet (a stage's fraction grew, or a stage ended)
        self._stage: str | None = None
        self._first = 0.0
        self._fraction = 0.0
        self._moved = 0.0  # when the current stage's fraction last grew (or it began)
        self._samples: deque[tuple[float, float]] = deque()
        self._last: tuple[float, float] | None = None  # (when, estimate)

    def replan(self, plan: StagePlan) -> None:
        """Go on with the run's new :class:`StagePlan` (its rows now known): what was measured so far
        stays, the current stage keeps the cost it is measured against, the stages to come take the plan's."""
        costs = dict(plan.costs)
        if self._stage is not None:
            costs[self._stage] = self._costs.get(self._stage, 0.0)
        self._spans, self._costs = plan.spans, costs

    def _within(self, stage: str, overall: float) -> float | None:
        lo, hi = self._spans.get(stage, (0.0, 0.0))
        if stage not in self._spans or hi <= lo:
            return None
        return min(1.0, max(0.0, (overall - lo) / (hi - lo)))

    def _measure(self, now: float, stage: str, seconds: float, covered: float) -> None:
        """Add ``seconds`` of ``stage`` that did ``covered`` calibrated seconds of work, ending ``now``."""
        if stage in UNTIMED_STAGES:
            return
        fade = math.exp(-max(0.0, now - self._heard) / self._memory)
        self._spent = self._spent * fade + seconds
        self._covered = self._covered * fade + covered
        self._heard = now

    def _speed(self, now: float) -> float | None:
        """Seconds per calibrated second on this run, recent ones weighing more (None: nothing to go on)."""
        bound = None
        stage = self._stage
        if stage is not None and stage in self._spans and stage not in UNTIMED_STAGES:
            rest = self._costs.get(stage, 0.0) * (1.0 - self._fraction)
            if rest > 0:
                # The silent seconds since the last report, with the whole rest of the stage: a floor.
                bound = (self._spent + now - self._moved) / (self._covered + rest)
        speed = None
        if self._covered > 1e-6 and self._spent > 0:
            speed = self._spent / self._covered
        elif self._moving or stage not in UNTIMED_STAGES:
            speed = 1.0  # the calibration's, until a stage that says something of the speed is measured
        if speed is None:
            return bound
        return speed if bound is None else max(speed, bound)

    def update(self, now: float, stage: str, overall: float) -> float | None:
        """Hear the engine's ``progress(stage, overall)`` at time ``now`` (seconds); the seconds left, or None."""
        fraction = self._within(stage, overall)
        if fraction is None:
            if self._last is None:
                return None
            when, said = self._last
            return max(0.0, said - (now - when))
        if stage != self._stage:
            if self._stage is not None:
                # The seconds since its last move, with the work it did in them (nothing more, or it
                # would have said so), close the stage.
                self._measure(now, self._stage, now - self._moved, 0.0)
                self._moving = True
            self._stage, self._first, self._fraction, self._moved = stage, fraction, fraction, now
            self._samples.clear()
        elif fraction > self._fraction:
            self._measure(now, stage, now - self._moved, self._costs.get(stage, 0.0) * (fraction - self._fraction))
            self._moved, self._moving = now, True
        self._fraction = fraction
        self._samples.append((now, fraction))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self._window:
            self._samples.popleft()
        estimate = self._estimate(stage, fraction, now)
        if estimate is not None:
            self._last = (now, estimate)
        return estimate

    def _estimate(self, stage: str, fraction: float, now: float) -> float | None:
        speed = self._speed(now)
        if speed is None:
            return None
        then, before = self._samples[0]
        silent = now - self._moved
        current = max(speed * self._costs.get(stage, 0.0) * (1.0 - fraction) - silent, self.OVERRUN_SHARE * silent)
        if now - then >= self.MIN_RATE_S and fraction - before > 1e-6:
            own = (1.0 - fraction) * (now - then) / (fraction - before)
            # The stage's own rate weighs as much as the share of it done: a stage's first minute
            # (a warm-up, a burst of load) does not outweigh the speed the whole run has shown.
            done = (fraction - self._first) / max(1.0 - self._first, 1e-9)
            current = done * own + (1.0 - done) * current
        _, end = self._spans[stage]
        later = sum(cost for other, (lo, hi) in self._spans.items()
                    if other != stage and lo >= end and hi > lo and (cost := self._costs.get(other, 0.0)) > 0)
        return current + speed * later
