"""One candidate of an accuracy budget: a pruned copy of the dense model, recovered as the final model is.

The budget's search (:mod:`cahp_engine.run._budget`) hands out its work as :class:`CandidateSpec`
records: which heads, how far along its recovery schedule to train, and what may stop it early.
:func:`recover_candidate` does that work from the spec and the run's shared :class:`SearchInputs`
alone, deterministically for the spec's seed, so a round's candidates are independent units of work;
a :class:`~cahp_engine.run._executors.CandidateExecutor` runs them (one after another, or across a
pool of workers). A candidate's recovery is the run's final protocol
(``epochs``, ``early_stopping_patience``, ``eval_steps``, the run's loss and class weights):
:class:`CandidateRun` holds it between two pieces of work, and the chosen candidate's run, trained to
its end, is the result (no second recovery).

After each evaluation on the validation split a candidate stops early when:

* it **meets the budget** (``within_budget``): its score is at least ``threshold``, it lost no class the
  dense model recalls and, with ``budget_confidence``, the one-sided upper bound of its drop is within
  P. Recovery keeps its best weights, so it can only end higher: the search pauses it there;
* it **cannot reach** the threshold (``cannot_reach``): once its own curve has two evaluations after
  training began, its best score plus the largest gain per epoch seen so far (of its own best score,
  or of any other candidate's: ``gain_per_epoch``; between two evaluations after training began, so
  the large first recovery from the freshly pruned model does not count), sustained over every epoch
  it has left, is still below the threshold;
* early stopping ends its recovery (``no_gain``), or its schedule ends (``completed``).
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from cahp_engine.config import PruningConfig
from cahp_engine.data import EncodedDataset
from cahp_engine.models import prune_heads
from cahp_engine.recovery import (
    ClassificationMetrics,
    FineTuning,
    FineTuningHooks,
    TeacherLogits,
    TrainingResult,
    drop_interval,
)
from cahp_engine.results import DropInterval, JsonRecord, ValidationPoint
from cahp_engine.run._holdout import ValidationScorer
from cahp_engine.run._reconstruct import calibration_batches, reconstruct_pruned, reconstructs
from cahp_engine.run._stage_training import distillation, run_recipe, validation_watch

__all__ = ["CandidateResult", "CandidateRun", "CandidateSpec", "SearchInputs", "begin_run", "recover_candidate"]


@dataclass(frozen=True)
class CandidateSpec(JsonRecord):
    """One piece of a candidate's work, small and serialisable.

    Attributes
    ----------
    strategy : str
    k : int
        Clusters the strategy chose at.
    kept : dict of int to tuple of int
        The heads to keep, per layer (every layer present).
    seed : int
        Seeds its recovery (the run's seed).
    until_epochs : float
        Train (from where its recovery stands) up to this many epochs of its schedule.
    finish : bool
        Train to the end of the protocol: no pause at the budget, no abandonment (the chosen one).
    gain_per_epoch : float or None
        The largest gain per epoch the search has seen in other candidates (None: none yet); the
        abandonment rule takes the larger of it and the candidate's own.
    """

    strategy: str
    k: int
    kept: dict[int, tuple[int, ...]]
    seed: int
    until_epochs: float
    finish: bool = False
    gain_per_epoch: float | None = None

    @property
    def heads_kept(self) -> int:
        return sum(len(heads) for heads in self.kept.values())

    @property
    def key(self) -> str:
        """Names the candidate (not the piece of work): one strategy's choice at one ``k``."""
        return f"{self.strategy}@{self.k}"


@dataclass(frozen=True)
class SearchInputs:
    """What every candidate of one run shares; a worker that runs candidates builds it once.

    Attributes
    ----------
    dense : nn.Module
        The dense model (after dense fine-tuning when it ran), never modified.
    train : EncodedDataset
        The training rows recovery trains on (carved rows left out).
    validation : EncodedDataset
        The validation split; the evaluation split is not among the inputs.
    dense_validation : ClassificationMetrics
        The dense model on it.
    dense_predictions : ndarray of shape (n,)
        Its predictions there, for the paired bootstrap.
    teacher : TeacherLogits or None
        The dense model's logits over ``train`` when recovery distils.
    class_weights : ndarray of shape (C,) or None
        Class-balanced recovery's weights.
    config : PruningConfig
        The recipe, the metric, P and ``budget_confidence``.
    device : torch.device
    threshold : float
        The score a candidate must reach (dense - P / 100).
    """

    dense: nn.Module
    train: EncodedDataset
    validation: EncodedDataset
    dense_validation: ClassificationMetrics
    dense_predictions: np.ndarray
    teacher: TeacherLogits | None
    class_weights: np.ndarray | None
    config: PruningConfig
    device: torch.device
    threshold: float
    progress: Callable[[int, int], None] | None = None
    should_cancel: Callable[[], bool] | None = None
    steps_done: Callable[[int], None] | None = None  # training steps another process took for the search

    def drop(self, predictions: np.ndarray) -> DropInterval:
        """The drop of the model that predicted ``predictions`` on the validation split, with its interval."""
        return drop_interval(self.validation.labels, self.dense_predictions, predictions,
                             num_classes=self.validation.num_classes, metric=self.config.budget_metric,
                             seed=self.config.seed, confidence=self.config.budget_confidence)

    def meets(self, point: ValidationPoint, predictions: np.ndarray) -> bool:
        """Whether an evaluation meets the budget (see the module's docstring)."""
        if point.lost_classes or point.score < self.threshold - 1e-12:
            return False
        if self.config.budget_confidence is None:
            return True
        upper = self.drop(predictions).upper
        assert upper is not None  # a confidence was given
        return upper <= float(self.config.max_accuracy_drop or 0.0) + 1e-9


@dataclass
class CandidateRun:
    """A candidate's recovery in progress: its pruned model, its fine-tuning and its scorer."""

    model: nn.Module
    tuning: FineTuning
    scorer: ValidationScorer
    seconds: float = 0.0
    met: int | None = None  # the first evaluation that met the budget
    stopped: str | None = None  # set once it can train no more
    reason: str = ""

    @property
    def curve(self) -> tuple[ValidationPoint, ...]:
        return () if self.tuning.best is None else tuple(self.tuning.best.curve)

    @property
    def best(self) -> int:
        assert self.tuning.best is not None and self.tuning.best.best is not None
        return self.tuning.best.best


@dataclass(frozen=True)
class CandidateResult:
    """What one piece of work left: the candidate's state and why it paused or stopped.

    ``status`` is ``paused`` (it reached ``until_epochs`` and may train on), ``within_budget``,
    ``cannot_reach``, ``no_gain`` or ``completed``; ``run`` resumes it (None once the search let it go).
    """

    spec: CandidateSpec
    status: str
    reason: str
    curve: tuple[ValidationPoint, ...]
    best: ValidationPoint
    epochs: float
    seconds: float
    drop: DropInterval
    run: CandidateRun | None = field(repr=False)

    def gains_per_epoch(self) -> list[float]:
        """:func:`gains_per_epoch` of its curve."""
        return gains_per_epoch(self.curve)


def gains_per_epoch(curve: tuple[ValidationPoint, ...]) -> list[float]:
    """Gains of the running best score per epoch between consecutive evaluations after training began.

    ``curve[0]`` is before training: the first recovery of a freshly pruned model gains far more than
    any later epoch, so the gains start between ``curve[1]`` and ``curve[2]``.
    """
    out: list[float] = []
    if len(curve) < 3:
        return out
    best = max(curve[0].score, curve[1].score)
    for prev, point in zip(curve[1:], curve[2:], strict=False):
        span = point.epoch - prev.epoch
        if span > 0:
            out.append(max(0.0, point.score - best) / span)
        best = max(best, point.score)
    return out


def start_run(spec: CandidateSpec, inputs: SearchInputs) -> CandidateRun:
    """A fresh pruned copy of the dense model with ``spec``'s heads, and its recovery not yet begun."""
    config = inputs.config
    model = copy.deepcopy(inputs.dense)
    prune_heads(model, {layer: list(heads) for layer, heads in spec.kept.items()})
    model.eval()
    if reconstructs(config):  # recovery reconstruct+finetune: the fine-tuning starts from the refit weights
        reconstruct_pruned(inputs.dense, model, calibration_batches(inputs.train, config, inputs.device), config,
                           should_cancel=inputs.should_cancel)
    return begin_run(model, inputs, seed=spec.seed)


def begin_run(model: nn.Module, inputs: SearchInputs, *, seed: int) -> CandidateRun:
    """``model``'s recovery as the run's final protocol, not yet begun, judged on the validation split."""
    config = inputs.config
    scorer = ValidationScorer(inputs.validation, config.budget_metric, inputs.dense_validation, config.batch_size,
                              inputs.device)
    recipe = dataclasses.replace(run_recipe(config, inputs.device), seed=seed,
                                 distillation=distillation(config, inputs.teacher), class_weights=inputs.class_weights)
    tuning = FineTuning(model, inputs.train, recipe, watch=validation_watch(config, scorer),
                        hooks=FineTuningHooks(progress=inputs.progress, should_cancel=inputs.should_cancel))
    return CandidateRun(model=model, tuning=tuning, scorer=scorer)


def recover_candidate(spec: CandidateSpec, inputs: SearchInputs, *, resume: CandidateRun | None = None
                      ) -> CandidateResult:
    """Recover one candidate from where ``resume`` left it (else from its start) as far as ``spec`` says.

    Deterministic for ``spec.seed``: the same spec and inputs give the same curve and weights, and a
    recovery paused and resumed ends as an uninterrupted one.
    """
    started = time.perf_counter()
    run = resume if resume is not None else start_run(spec, inputs)
    tuning = run.tuning
    total_epochs = tuning.total / tuning.batches_per_epoch
    status, reason = "paused", ""
    until = int(np.floor(spec.until_epochs * tuning.batches_per_epoch + 0.5))
    while run.stopped is None:
        next_stop = tuning.next_stop
        if next_stop is None:
            run.stopped, run.reason = _ended(tuning)
            break
        if next_stop > until and not spec.finish:
            break
        point = tuning.advance()
        assert point is not None  # the candidate's recovery always validates
        if spec.finish:
            continue
        if run.met is None and inputs.meets(point, run.scorer.predictions[-1]):
            run.met = len(run.scorer.predictions) - 1
            status, reason = "within_budget", (f"met the budget after {point.epoch:g} epoch(s): "
                                               f"{point.score:.4f} >= {inputs.threshold:.4f}")
            break
        best = run.curve[run.best]
        left = total_epochs - tuning.epoch
        own = gains_per_epoch(run.curve)
        if own and left > 0 and not tuning.done:
            gain = max([*own, *(() if spec.gain_per_epoch is None else (spec.gain_per_epoch,))])
            if best.score + gain * left < inputs.threshold:
                run.stopped = "cannot_reach"
                run.reason = (f"cannot reach {inputs.threshold:.4f}: best {best.score:.4f} + {left:g} epoch(s) "
                              f"left x {gain:.4f} (the largest gain per epoch seen) falls short")
    if run.stopped is not None and status == "paused":
        status, reason = run.stopped, run.reason
    elif status == "paused":
        reason = f"paused after {tuning.epoch:g} epoch(s) (the end of its rung or probe)"
    run.seconds += time.perf_counter() - started
    best_index = run.best
    return CandidateResult(spec=spec, status=status, reason=reason, curve=run.curve, best=run.curve[best_index],
                           epochs=tuning.epoch, seconds=run.seconds,
                           drop=inputs.drop(run.scorer.predictions[best_index]), run=run)


def finish_run(run: CandidateRun) -> tuple[nn.Module, TrainingResult]:
    """The candidate's model with its best weights, and its whole recovery's record."""
    return run.model, run.tuning.finish()


def _ended(tuning: FineTuning) -> tuple[str, str]:
    best = tuning.best.best_point if tuning.best is not None else None
    at = "" if best is None else f"; best {best.score:.4f} after {best.epoch:g} epoch(s)"
    if tuning.stopped_early:
        return "no_gain", f"early stopping: {tuning.best.patience if tuning.best else 0} evaluation(s) without gain{at}"
    return "completed", f"trained every epoch without meeting the budget{at}"
