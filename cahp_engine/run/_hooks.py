"""What a caller of a run hears and decides while it runs: :class:`RunHooks`, every field optional.

The second argument of :func:`~cahp_engine.run.run_pruning` (the first, :class:`~cahp_engine.run.RunRequest`,
says what to run). ``cahp prune`` passes a progress bar and a log; the job service's worker passes its
reporter, its cancel check, its resume store in the artifact store and its pool of workers for an accuracy
budget's candidates. None of it changes the result: a run with hooks makes the run without them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cahp_engine.progress import StagePlan
from cahp_engine.run._executors import CandidateExecutor
from cahp_engine.run._live import LOG_INTERVAL_S
from cahp_engine.run._resume import ResumeStore
from cahp_engine.run._target_record import TargetRecord

__all__ = ["RunHooks"]


@dataclass(frozen=True)
class RunHooks:
    """The callbacks and helpers of one run.

    Attributes
    ----------
    progress : callable(stage, overall_fraction) or None
        ``overall_fraction`` places the stage's own progress in its span
        (:func:`~cahp_engine.progress.stage_plan` of the run's settings, then, once its data is loaded,
        of its rows too: ``plan`` hears when); it never decreases.
    should_cancel : callable() -> bool or None
        Polled between steps; True raises :class:`~cahp_engine.errors.JobCancelledError`.
    log : callable(str) or None
        Receives human-readable lines about what the run is doing: at least one every
        ``log_interval_s`` seconds of a long stage (a fine-tuning's epoch, loss and pace).
    log_interval_s : float
    resume_store : ResumeStore or None
        Where the run saves each finished stage and its fine-tunings' stops, and whence it resumes what
        an earlier run of the same job saved (:mod:`cahp_engine.run._resume`).
    save_interval_s : float
        A fine-tuning's state is saved at its stops (epoch ends), no more often than this.
    save_when_stopped : callable() -> bool or None
        Asked when ``should_cancel`` stops a fine-tuning: True saves its state at the last step taken
        first (the job service: a worker that shuts down hands its job back without losing the epoch).
    candidates : CandidateExecutor or None
        Runs an accuracy budget's candidates (None: here, one after another; the job service: its
        worker pool). The answer is the same whoever runs them.
    plan : callable(StagePlan) or None
        Hears, once the data is loaded, the :class:`~cahp_engine.progress.StagePlan` the run's progress
        follows from then on: each stage's span and expected cost on the run's rows (a time-left estimate
        maps the progress back to its stages with it).
    target_decided : callable(TargetRecord) or None
        Hears a speed or FLOPs target's record (the report's ``target``) as soon as the run has pruned to it,
        before reconstruction and recovery: the predicted speed-up and what each layer keeps, while the run
        goes on (the job service: an event of the job's stream). A later attempt of a job decides again.
    """

    progress: Callable[[str, float], None] | None = None
    should_cancel: Callable[[], bool] | None = None
    log: Callable[[str], None] | None = None
    log_interval_s: float = LOG_INTERVAL_S
    resume_store: ResumeStore | None = None
    save_interval_s: float = 0.0
    save_when_stopped: Callable[[], bool] | None = None
    candidates: CandidateExecutor | None = None
    plan: Callable[[StagePlan], None] | None = None
    target_decided: Callable[[TargetRecord], None] | None = None

    def say(self, line: str) -> None:
        """``log(line)``, or nothing without a log."""
        if self.log is not None:
            self.log(line)
