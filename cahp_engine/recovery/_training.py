"""Fine-tuning of a sequence classifier: dense training and recovery after pruning.

A plain torch loop rather than the transformers ``Trainer``: the loop is short, needs no
``accelerate`` at run time, and lets the caller see every step (progress and cancellation).

:class:`FineTuning` is one fine-tuning in progress. :meth:`FineTuning.advance` trains to its next
stop (an evaluation step when it watches a validation split, else an epoch's end) and evaluates
there; between two calls it holds everything it needs to go on (optimiser, schedule, batch position,
random state), so a fine-tuning paused and resumed ends exactly as an uninterrupted one, and
:meth:`FineTuning.state_dict` is that state, to save and resume from. :meth:`FineTuning.finish` hands back the
best evaluation's weights (:mod:`cahp_engine.recovery._best`). :func:`finetune` runs one to its end.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import get_linear_schedule_with_warmup

from cahp_engine._torch import as_device, model_inputs
from cahp_engine.data import EncodedDataset, iterate_batches, length_grouped_batches
from cahp_engine.errors import DatasetError, JobCancelledError, PipelineError
from cahp_engine.recovery._best import BestWeights, ValidationWatch
from cahp_engine.recovery._recipe import (
    TrainingRecipe,
    balanced_class_weights,
    described,
    epoch_seed,
    loss_fn,
    param_groups,
    precision_for,
)
from cahp_engine.recovery._training_records import TrainingResult
from cahp_engine.results import ValidationPoint

__all__ = ["FineTuning", "FineTuningHooks", "TrainingResult", "balanced_class_weights", "finetune"]


@dataclass(frozen=True)
class FineTuningHooks:
    """What a fine-tuning reports to and asks its caller, and the state it goes on from.

    Attributes
    ----------
    progress : callable (step, total_steps), optional
        Called after every optimiser step; ``step`` counts from 1.
    should_cancel : callable () -> bool, optional
        Asked before every step; True raises :class:`~cahp_engine.errors.JobCancelledError`.
    resume : mapping, optional
        A :meth:`FineTuning.state_dict` taken by an earlier run of this fine-tuning (same model, data
        and recipe): it goes on from there and ends as if it had never stopped.
    on_stop : callable (FineTuning) -> None, optional
        Called with the fine-tuning once before its first step (after ``resume`` is loaded) and after
        every stop (each epoch's end, or each evaluation): the moment to save :meth:`FineTuning.state_dict`,
        or to read its running figures (:meth:`FineTuning.result`) from ``progress``.
    """

    progress: Callable[[int, int], None] | None = None
    should_cancel: Callable[[], bool] | None = None
    resume: Mapping[str, Any] | None = None
    on_stop: Callable[[FineTuning], None] | None = None


def finetune(model: nn.Module, data: EncodedDataset, recipe: TrainingRecipe, *, watch: ValidationWatch | None = None,
             hooks: FineTuningHooks | None = None) -> TrainingResult:
    """Fine-tune every parameter of ``model`` on ``data`` with AdamW and a linear warm-up/decay.

    Parameters
    ----------
    model : a ``*ForSequenceClassification`` model with at least ``data.num_classes`` labels
        Trained in place on ``recipe.device`` (where it stays). It is in train mode during the run and
        in eval mode after it, also after an error; its ``requires_grad`` flags are restored and its
        gradients cleared.
    data : EncodedDataset of n samples
    recipe : TrainingRecipe
        Epochs, rate, batch, warm-up, decay, clipping, seed, device and loss.
    watch : ValidationWatch, optional
        A validation split to evaluate on: the best evaluation's weights are handed back, and early
        stopping applies.
    hooks : FineTuningHooks, optional
        Progress, cancellation, a saved state to go on from, and a call at every stop.

    Returns
    -------
    TrainingResult
        With ``watch``: the validation curve, the best evaluation's step and epoch and whether
        training stopped early too.

    Raises
    ------
    JobCancelledError
        When ``hooks.should_cancel()`` answers True.
    PipelineError
        When the loss becomes NaN or infinite.

    References
    ----------
    Paper Section IV-B.5 (the recipe: :class:`~cahp_engine.recovery.TrainingRecipe`).
    """
    tuning = FineTuning(model, data, recipe, watch=watch, hooks=hooks)
    while not tuning.done:
        tuning.advance()
    return tuning.finish()


class FineTuning:
    """One fine-tuning in progress: :func:`finetune`'s arguments, advanced stop by stop.

    ``stops`` are the steps at which :meth:`advance` returns: every evaluation step when there is a
    ``watch`` (step 0 first), else every epoch's end. ``done`` turns True after the last step, or
    once early stopping ends the fine-tuning. Between two :meth:`advance` calls the model is in eval
    mode with its own ``requires_grad`` flags, and the caller's global random state is untouched.
    ``hooks.resume`` is loaded when the fine-tuning is built, and ``hooks.on_stop`` called then and at
    the end of every :meth:`advance` that reached a stop.
    """

    def __init__(self, model: nn.Module, data: EncodedDataset, recipe: TrainingRecipe, *,
                 watch: ValidationWatch | None = None, hooks: FineTuningHooks | None = None) -> None:
        distillation, hooks = recipe.distillation, hooks or FineTuningHooks()
        if distillation is not None and distillation.teacher.logits.shape[0] != len(data):
            raise PipelineError(f"the teacher's logits cover {distillation.teacher.logits.shape[0]} rows but the "
                                f"training data has {len(data)}")
        if len(data) == 0:
            raise DatasetError("the training split has no rows; give at least one labelled sample per class")
        self.model, self.data, self.recipe, self.seed = model, data, recipe, recipe.seed
        self.dev = as_device(recipe.device)
        self.precision = precision_for(self.dev)
        self.batch_size = recipe.batch_size
        self.batches_per_epoch = math.ceil(len(data) / recipe.batch_size)
        # Half-up rounding (not Python's round-half-even), and at least one step for any epochs > 0.
        self.total = 0 if recipe.epochs == 0 else max(1, math.floor(recipe.epochs * self.batches_per_epoch + 0.5))
        num_labels = int(getattr(model.config, "num_labels", data.num_classes))
        if self.total and int(data.labels.max()) >= num_labels:
            raise DatasetError(
                f"the data has labels up to {int(data.labels.max())} but the model has {num_labels} outputs; "
                "give a model with one output per class"
            )
        weights = None
        if recipe.class_weights is not None:
            padded = np.ones(num_labels)
            padded[: len(recipe.class_weights)] = np.asarray(recipe.class_weights, dtype=np.float64)[:num_labels]
            self.class_weights: tuple[float, ...] | None = tuple(float(w) for w in padded)
            weights = torch.tensor(padded, dtype=torch.float32, device=self.dev)
        else:
            self.class_weights = None
        self.loss_fn = loss_fn(distillation, self.dev, weights)
        self.auxiliary_loss = recipe.auxiliary_loss
        self.progress, self.should_cancel, self.on_stop = hooks.progress, hooks.should_cancel, hooks.on_stop
        self.max_grad_norm = recipe.max_grad_norm
        self.validate = None if watch is None else watch.validate
        self.best = None if watch is None else BestWeights(watch.early_stopping_patience, watch.rank)
        every = watch.eval_steps if watch is not None and watch.eval_steps > 0 else self.batches_per_epoch
        self.stops = [*(() if watch is None else (0,)), *range(every, self.total, every), self.total]
        self.step = 0
        self.stopped_early = False
        self._next_stop = 0
        self._epochs: dict[int, list[float]] = {}  # epoch -> [loss sum, batches, seconds]
        self._wall = 0.0
        self._rng: torch.Tensor | None = None
        self._cuda_rng: torch.Tensor | None = None
        model.to(self.dev)
        self.optimizer = torch.optim.AdamW(param_groups(model, recipe.weight_decay), lr=recipe.lr)
        self.scheduler = get_linear_schedule_with_warmup(self.optimizer, math.ceil(recipe.warmup_ratio * self.total),
                                                         max(self.total, 1))
        self.scaler = torch.amp.GradScaler("cuda") if self.precision == "fp16" else None
        if hooks.resume is not None:
            self.load_state_dict(dict(hooks.resume))
        if self.on_stop is not None:
            self.on_stop(self)

    @property
    def done(self) -> bool:
        return self._next_stop >= len(self.stops) or self.stopped_early or self.total == 0

    @property
    def next_stop(self) -> int | None:
        """The step at which the next :meth:`advance` returns (None when done)."""
        return None if self.done else self.stops[self._next_stop]

    @property
    def epoch(self) -> float:
        """Passes over the data made so far."""
        return self.step / self.batches_per_epoch

    def advance(self) -> ValidationPoint | None:
        """Train to the next stop and evaluate there (when validating); the evaluation, else None."""
        if self.done:
            return None
        target = self.stops[self._next_stop]
        if target > self.step:
            self._train_until(target)  # stopped part-way (cancelled), the stop is still ahead
        self._next_stop += 1
        point = None
        if self.validate is not None and self.best is not None:
            point = self.validate(self.model, self.step, self.epoch)
            self.best.observe(self.model, point)
            if self.best.exhausted and self.step < self.total:
                self.stopped_early = True
        if self.on_stop is not None:
            self.on_stop(self)
        return point

    def finish(self) -> TrainingResult:
        """Load the best evaluation's weights (when validating) and return what the fine-tuning did."""
        if self.best is not None:
            self.best.restore(self.model)
        self.model.eval()
        return self.result()

    def result(self) -> TrainingResult:
        """What the fine-tuning did so far."""
        epochs = [self._epochs[e] for e in sorted(self._epochs)]
        best = None if self.best is None else self.best.best_point
        result = TrainingResult(
            steps=self.step, epochs=self.step / self.batches_per_epoch,
            loss_per_epoch=tuple(s / n for s, n, _ in epochs), wall_s=self._wall,
            seconds_per_epoch=tuple(t for _, _, t in epochs), device=str(self.dev), precision=self.precision,
            class_weights=self.class_weights,
            validation=() if self.best is None else tuple(self.best.curve),
            best_step=None if best is None else best.step, best_epoch=None if best is None else best.epoch,
            stopped_early=self.stopped_early, early_stopping_patience=0 if self.best is None else self.best.patience)
        return described(result, self.recipe.distillation)

    # --------------------------------------------------------------------------- resume state

    def state_dict(self) -> dict[str, Any]:
        """Everything the fine-tuning needs to go on from here in another process (with the same inputs).

        Take it between two :meth:`advance` calls, e.g. at every epoch's end, or after an
        :meth:`advance` that a cancellation interrupted between two steps (it then holds the last step
        taken, and the interrupted stop is still ahead), and hand it to :meth:`load_state_dict` of a
        :class:`FineTuning` built with the same arguments on a fresh copy of the same model (or give it
        as ``hooks.resume``).
        """
        return {"model": {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()},
                "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "scaler": None if self.scaler is None else self.scaler.state_dict(), "step": self.step,
                "next_stop": self._next_stop, "stopped_early": self.stopped_early,
                "epochs": {e: list(v) for e, v in self._epochs.items()}, "wall": self._wall, "rng": self._rng,
                "cuda_rng": self._cuda_rng, "best": None if self.best is None else self.best.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and state["scaler"] is not None:
            self.scaler.load_state_dict(state["scaler"])
        self.step, self._next_stop, self.stopped_early = state["step"], state["next_stop"], state["stopped_early"]
        self._epochs = {int(e): list(v) for e, v in state["epochs"].items()}
        self._wall, self._rng, self._cuda_rng = state["wall"], state["rng"], state["cuda_rng"]
        if self.best is not None and state["best"] is not None:
            self.best.load_state_dict(state["best"])

    # --------------------------------------------------------------------------- the loop

    def _train_until(self, target: int) -> None:
        """Optimiser steps ``self.step`` .. ``target - 1``, in the random state the last call left."""
        model, dev = self.model, self.dev
        flags = [(p, p.requires_grad) for p in model.parameters()]
        rng_devices = [] if dev.type != "cuda" else [torch.cuda.current_device() if dev.index is None else dev.index]
        start = time.perf_counter()
        try:
            # fork_rng keeps dropout reproducible under `seed` without disturbing the caller's generator;
            # the state it ends in is kept for the next call, so pausing changes nothing.
            with torch.random.fork_rng(devices=rng_devices):
                if self._rng is None:
                    torch.manual_seed(self.seed)
                else:
                    torch.set_rng_state(self._rng)
                    if rng_devices and self._cuda_rng is not None:
                        torch.cuda.set_rng_state(self._cuda_rng, rng_devices[0])
                for p, _ in flags:
                    p.requires_grad_(True)
                model.to(dev).train()
                try:
                    while self.step < target:
                        self._epoch_until(target)
                finally:
                    # Also when cancelled between two steps: the state then is that of the last step
                    # taken, and state_dict() can be saved and resumed from there.
                    self._rng = torch.get_rng_state()
                    if rng_devices:
                        self._cuda_rng = torch.cuda.get_rng_state(rng_devices[0])
        finally:
            self._wall += time.perf_counter() - start
            model.eval()
            for p, flag in flags:
                p.grad = None
                p.requires_grad_(flag)

    def _epoch_until(self, target: int) -> None:
        """The steps of the current epoch up to ``target`` (the epoch's batch order comes from the seed)."""
        epoch, offset = divmod(self.step, self.batches_per_epoch)
        started = time.perf_counter()
        batches = length_grouped_batches(self.data.lengths, np.arange(len(self.data)), self.batch_size,
                                         shuffle_seed=epoch_seed(self.seed, epoch))
        batches = batches[offset: offset + target - self.step]
        record = self._epochs.setdefault(epoch, [0.0, 0, 0.0])
        try:
            for rows, batch in zip(batches, iterate_batches(self.data, batches, self.dev), strict=True):
                if self.should_cancel is not None and self.should_cancel():
                    raise JobCancelledError(f"fine-tuning was cancelled after {self.step} of {self.total} steps")
                value = self._one_step(rows, batch)
                self.step += 1
                record[0] += value
                record[1] += 1
                if self.progress is not None:
                    self.progress(self.step, self.total)
        finally:
            record[2] += time.perf_counter() - started

    def _one_step(self, rows: np.ndarray, batch: dict[str, torch.Tensor]) -> float:
        """One optimiser step on one batch; its loss."""
        model, precision = self.model, self.precision
        autocast: contextlib.AbstractContextManager[Any] = (
            torch.autocast("cuda", dtype=torch.bfloat16 if precision == "bf16" else torch.float16)
            if self.dev.type == "cuda" else contextlib.nullcontext())
        with autocast:
            if self.auxiliary_loss is None:
                outputs = model(**model_inputs(model, batch))
            else:
                outputs = model(**model_inputs(model, batch), output_hidden_states=True)
        loss = self.loss_fn(outputs.logits, batch["labels"], rows)
        if self.auxiliary_loss is not None:
            loss = loss + self.auxiliary_loss(outputs, batch)
        value = float(loss.detach())  # one sync per step, needed for the NaN check anyway
        if not math.isfinite(value):
            raise PipelineError(
                f"the training loss became {value} at step {self.step + 1} of {self.total}; lower the learning "
                f"rate (now {self.optimizer.defaults['lr']:g}) or check the model's weights for NaN/inf"
            )
        optimizer, params = self.optimizer, [p for group in self.optimizer.param_groups for p in group["params"]]
        optimizer.zero_grad(set_to_none=True)
        if self.scaler is None:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
            optimizer.step()
            self.scheduler.step()
        else:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
            self.scaler.step(optimizer)
            self.scaler.update()
            with warnings.catch_warnings():
                # A step skipped for fp16 overflow makes torch warn that the schedule moved
                # before the optimiser; like the Trainer, keep the schedule on the step count.
                warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)`")
                self.scheduler.step()
        return value
