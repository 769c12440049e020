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
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import get_linear_schedule_with_warmup

from cahp_engine._torch import as_device, model_inputs
from cahp_engine._validation import Interval, check
from cahp_engine.data import EncodedDataset, iterate_batches, length_grouped_batches
from cahp_engine.errors import DatasetError, JobCancelledError, PipelineError
from cahp_engine.recovery._best import BestWeights, Rank, Validator
from cahp_engine.recovery._distillation import TeacherLogits
from cahp_engine.recovery._recipe import (
    AuxiliaryLoss,
    balanced_class_weights,
    check_recipe,
    described,
    epoch_seed,
    loss_fn,
    param_groups,
    precision_for,
)
from cahp_engine.recovery._training_records import TrainingResult
from cahp_engine.results import ValidationPoint

__all__ = ["FineTuning", "TrainingResult", "balanced_class_weights", "finetune"]


def finetune(
    model: nn.Module,
    data: EncodedDataset,
    *,
    epochs: float,
    lr: float,
    batch_size: int,
    warmup_ratio: float,
    weight_decay: float,
    max_grad_norm: float,
    seed: int,
    device: torch.device | str = "cpu",
    progress: Callable[[int, int], None] | None = None,
    should_cancel: Callable[[], bool] | None = None,
    teacher: TeacherLogits | None = None,
    alpha: float = 0.5,
    temperature: float = 4.0,
    auxiliary_loss: AuxiliaryLoss | None = None,
    class_weights: np.ndarray | None = None,
    validate: Validator | None = None,
    early_stopping_patience: int = 0,
    eval_steps: int = 0,
    rank: Rank | None = None,
    resume: Mapping[str, Any] | None = None,
    on_stop: Callable[[FineTuning], None] | None = None,
) -> TrainingResult:
    """Fine-tune every parameter of ``model`` on ``data`` with AdamW and a linear warm-up/decay.

    Parameters
    ----------
    model : a ``*ForSequenceClassification`` model with at least ``data.num_classes`` labels
        Trained in place on ``device`` (where it stays). It is in train mode during the run and in
        eval mode after it, also after an error; its ``requires_grad`` flags are restored and its
        gradients cleared.
    data : EncodedDataset of n samples
    epochs : float >= 0
        Passes over the data; a fraction runs that share of one epoch's batches (0.25 is a quarter),
        and 0 returns at once without touching the model.
    lr, warmup_ratio, weight_decay, max_grad_norm, batch_size
        The recipe. Warm-up lasts ``ceil(warmup_ratio * steps)`` steps. Weight decay skips biases
        and LayerNorm weights.
    seed : int
        Seeds the batch order (a different order each epoch) and dropout; the caller's global torch
        random state is left as it was.
    device : str or torch.device
        On CUDA the forward pass runs under bf16 autocast, or fp16 with loss scaling where bf16 is
        not supported; on CPU in fp32.
    progress : callable (step, total_steps), optional
        Called after every optimiser step; ``step`` counts from 1.
    should_cancel : callable () -> bool, optional
        Asked before every step.
    teacher : TeacherLogits, optional
        A teacher's logits for every row of ``data``: the loss becomes
        :func:`~cahp_engine.recovery.distillation_loss` with ``alpha`` and ``temperature``
        (otherwise plain cross-entropy, and those two are ignored).
    auxiliary_loss : callable (outputs, batch) -> scalar tensor, optional
        A term added to every batch's loss, given the model's outputs (with ``hidden_states``: the
        forward pass then returns them) and the batch on ``device``. For experiments such as matching
        a teacher's hidden states (``python -m studies distill-study``); runs and jobs do not use it.
    class_weights : ndarray of shape (C,), optional
        Each class's weight in the loss (:func:`balanced_class_weights` for class-balanced recovery).
    validate : callable (model, step, epoch) -> ValidationPoint, optional
        Scores the model on a validation split: before the first step, every ``eval_steps`` steps
        (0: at every epoch's end) and after the last. The weights of the best evaluation (``rank``)
        are kept and handed back, so the result never ranks below the model it started from.
    early_stopping_patience : int >= 0
        With ``validate``: stop once this many evaluations in a row brought no better rank (0: train
        every step).
    eval_steps : int >= 0
    rank : callable (ValidationPoint) -> key, optional
        Orders evaluations (default :func:`~cahp_engine.recovery._best.default_rank`: no class lost,
        then the score).
    resume : mapping, optional
        A :meth:`FineTuning.state_dict` taken by an earlier run of this fine-tuning (same model, data
        and arguments): it goes on from there and ends as if it had never stopped.
    on_stop : callable (FineTuning) -> None, optional
        Called with the fine-tuning once before its first step and after every stop (each epoch's
        end, or each evaluation): the moment to save :meth:`FineTuning.state_dict`, or to read its
        running figures (:meth:`FineTuning.result`) from ``progress``.

    Returns
    -------
    TrainingResult
        With ``validate``: the validation curve, the best evaluation's step and epoch and whether
        training stopped early too.

    Raises
    ------
    JobCancelledError
        When ``should_cancel()`` answers True.
    PipelineError
        When the loss becomes NaN or infinite.

    References
    ----------
    Paper Section IV-B.5: recovery fine-tuning for 3 epochs at lr 2e-5, linear decay with 10%
    warm-up, weight decay 0.01, max gradient norm 1.0, batch size 32.
    """
    tuning = FineTuning(
        model, data, epochs=epochs, lr=lr, batch_size=batch_size, warmup_ratio=warmup_ratio,
        weight_decay=weight_decay, max_grad_norm=max_grad_norm, seed=seed, device=device, progress=progress,
        should_cancel=should_cancel, teacher=teacher, alpha=alpha, temperature=temperature,
        auxiliary_loss=auxiliary_loss, class_weights=class_weights, validate=validate,
        early_stopping_patience=early_stopping_patience, eval_steps=eval_steps, rank=rank)
    if resume is not None:
        tuning.load_state_dict(dict(resume))
    if on_stop is not None:
        on_stop(tuning)
    while not tuning.done:
        tuning.advance()
        if on_stop is not None:
            on_stop(tuning)
    return tuning.finish()


class FineTuning:
    """One fine-tuning in progress: :func:`finetune`'s parameters, advanced stop by stop.

    ``stops`` are the steps at which :meth:`advance` returns: every evaluation step when there is a
    ``validate`` (step 0 first), else every epoch's end. ``done`` turns True after the last step, or
    once early stopping ends the fine-tuning. Between two :meth:`advance` calls the model is in eval
    mode with its own ``requires_grad`` flags, and the caller's global random state is untouched.
    """

    def __init__(
        self, model: nn.Module, data: EncodedDataset, *, epochs: float, lr: float, batch_size: int,
        warmup_ratio: float, weight_decay: float, max_grad_norm: float, seed: int,
        device: torch.device | str = "cpu", progress: Callable[[int, int], None] | None = None,
        should_cancel: Callable[[], bool] | None = None, teacher: TeacherLogits | None = None,
        alpha: float = 0.5, temperature: float = 4.0, auxiliary_loss: AuxiliaryLoss | None = None,
        class_weights: np.ndarray | None = None, validate: Validator | None = None,
        early_stopping_patience: int = 0, eval_steps: int = 0, rank: Rank | None = None,
    ) -> None:
        check_recipe(epochs, lr, batch_size, warmup_ratio, weight_decay, max_grad_norm)
        check("early_stopping_patience", early_stopping_patience, Interval("integer", 0, None, closed="left"))
        check("eval_steps", eval_steps, Interval("integer", 0, None, closed="left"))
        if teacher is not None:
            check("alpha", alpha, Interval("real", 0, 1))
            check("temperature", temperature, Interval("real", 0, None, closed="neither"))
            if teacher.logits.shape[0] != len(data):
                raise PipelineError(f"the teacher's logits cover {teacher.logits.shape[0]} rows but the training "
                                    f"data has {len(data)}")
        if len(data) == 0:
            raise DatasetError("the training split has no rows; give at least one labelled sample per class")
        self.model, self.data, self.seed = model, data, seed
        self.dev = as_device(device)
        self.precision = precision_for(self.dev)
        self.batch_size = batch_size
        self.batches_per_epoch = math.ceil(len(data) / batch_size)
        # Half-up rounding (not Python's round-half-even), and at least one step for any epochs > 0.
        self.total = 0 if epochs == 0 else max(1, math.floor(epochs * self.batches_per_epoch + 0.5))
        num_labels = int(getattr(model.config, "num_labels", data.num_classes))
        if self.total and int(data.labels.max()) >= num_labels:
            raise DatasetError(
                f"the data has labels up to {int(data.labels.max())} but the model has {num_labels} outputs; "
                "give a model with one output per class"
            )
        weights = None
        if class_weights is not None:
            padded = np.ones(num_labels)
            padded[: len(class_weights)] = np.asarray(class_weights, dtype=np.float64)[:num_labels]
            self.class_weights: tuple[float, ...] | None = tuple(float(w) for w in padded)
            weights = torch.tensor(padded, dtype=torch.float32, device=self.dev)
        else:
            self.class_weights = None
        self.teacher, self.alpha, self.temperature = teacher, alpha, temperature
        self.loss_fn = loss_fn(teacher, alpha, temperature, self.dev, weights)
        self.auxiliary_loss = auxiliary_loss
        self.progress, self.should_cancel = progress, should_cancel
        self.max_grad_norm = max_grad_norm
        self.validate = validate
        self.best = BestWeights(early_stopping_patience, rank) if validate is not None else None
        every = eval_steps if validate is not None and eval_steps > 0 else self.batches_per_epoch
        self.stops = [*(() if validate is None else (0,)), *range(every, self.total, every), self.total]
        self.step = 0
        self.stopped_early = False
        self._next_stop = 0
        self._epochs: dict[int, list[float]] = {}  # epoch -> [loss sum, batches, seconds]
        self._wall = 0.0
        self._rng: torch.Tensor | None = None
        self._cuda_rng: torch.Tensor | None = None
        model.to(self.dev)
        self.optimizer = torch.optim.AdamW(param_groups(model, weight_decay), lr=lr)
        self.scheduler = get_linear_schedule_with_warmup(self.optimizer, math.ceil(warmup_ratio * self.total),
                                                         max(self.total, 1))
        self.scaler = torch.amp.GradScaler("cuda") if self.precision == "fp16" else None

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
        if self.validate is None or self.best is None:
            return None
        point = self.validate(self.model, self.step, self.epoch)
        self.best.observe(self.model, point)
        if self.best.exhausted and self.step < self.total:
            self.stopped_early = True
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
        return described(result, self.teacher, self.alpha, self.temperature)

    # --------------------------------------------------------------------------- resume state

    def state_dict(self) -> dict[str, Any]:
        """Everything the fine-tuning needs to go on from here in another process (with the same inputs).

        Take it between two :meth:`advance` calls, e.g. at every epoch's end, or after an
        :meth:`advance` that a cancellation interrupted between two steps (it then holds the last step
        taken, and the interrupted stop is still ahead), and hand it to :meth:`load_state_dict` of a
        :class:`FineTuning` built with the same arguments on a fresh copy of the same model.
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
