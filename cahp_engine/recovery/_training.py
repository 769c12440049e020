"""Fine-tuning of a sequence classifier: dense training and recovery after pruning.

A plain torch loop rather than the transformers ``Trainer``: the loop is short, needs no
``accelerate`` at run time, and lets the caller see every step (progress and cancellation).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from transformers import get_linear_schedule_with_warmup

from cahp_engine._torch import as_device, model_inputs
from cahp_engine._validation import Interval, check
from cahp_engine.data import EncodedDataset, iterate_batches, length_grouped_batches
from cahp_engine.errors import DatasetError, JobCancelledError, PipelineError
from cahp_engine.recovery._distillation import TeacherLogits, distillation_loss
from cahp_engine.results import TrainingResult

__all__ = ["TrainingResult", "finetune"]


def _check_recipe(epochs: float, lr: float, batch_size: int, warmup_ratio: float, weight_decay: float,
                  max_grad_norm: float) -> None:
    # The library call checks only what would make training meaningless (a negative epoch count, a zero
    # learning rate...). `PruningConfig`, the boundary of commands and jobs, adds upper bounds (lr <= 1,
    # epochs <= 1000, batch_size <= 4096) that catch typos there; a caller of `finetune` may go further.
    check("epochs", epochs, Interval("real", 0, None, closed="left"))
    check("lr", lr, Interval("real", 0, None, closed="neither"))
    check("batch_size", batch_size, Interval("integer", 1, None, closed="left"))
    check("warmup_ratio", warmup_ratio, Interval("real", 0, 1))
    check("weight_decay", weight_decay, Interval("real", 0, None, closed="left"))
    check("max_grad_norm", max_grad_norm, Interval("real", 0, None, closed="neither"))


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Decay matrices only: biases and LayerNorm scales are left out, as in BERT's recipe."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    seen: set[int] = set()
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if id(param) in seen:  # tied weights appear under several modules
                continue
            seen.add(id(param))
            exempt = name == "bias" or isinstance(module, nn.LayerNorm)
            (no_decay if exempt else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _epoch_seed(seed: int, epoch: int) -> int:
    # A SeedSequence keeps (seed, epoch) pairs apart; seed + epoch would give seed 1 epoch 0 the
    # same batch order as seed 0 epoch 1.
    return int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0])


def _precision(dev: torch.device) -> str:
    if dev.type != "cuda":
        return "fp32"
    return "bf16" if torch.cuda.is_bf16_supported() else "fp16"


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

    Returns
    -------
    TrainingResult

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
    _check_recipe(epochs, lr, batch_size, warmup_ratio, weight_decay, max_grad_norm)
    if teacher is not None:
        check("alpha", alpha, Interval("real", 0, 1))
        check("temperature", temperature, Interval("real", 0, None, closed="neither"))
        if teacher.logits.shape[0] != len(data):
            raise PipelineError(f"the teacher's logits cover {teacher.logits.shape[0]} rows but the training data "
                                f"has {len(data)}")
    dev = as_device(device)
    precision = _precision(dev)
    n = len(data)
    if n == 0:
        raise DatasetError("the training split has no rows; give at least one labelled sample per class")
    batches_per_epoch = math.ceil(n / batch_size)
    # Half-up rounding (not Python's round-half-even), and at least one step for any epochs > 0.
    total = 0 if epochs == 0 else max(1, math.floor(epochs * batches_per_epoch + 0.5))
    if total == 0:
        return _described(TrainingResult(steps=0, epochs=0.0, loss_per_epoch=(), wall_s=0.0, seconds_per_epoch=(),
                                         device=str(dev), precision=precision), teacher, alpha, temperature)
    num_labels = int(getattr(model.config, "num_labels", data.num_classes))
    if int(data.labels.max()) >= num_labels:
        raise DatasetError(
            f"the data has labels up to {int(data.labels.max())} but the model has {num_labels} outputs; "
            "give a model with one output per class"
        )

    flags = [(p, p.requires_grad) for p in model.parameters()]
    # fork_rng keeps dropout reproducible under `seed` without disturbing the caller's generator.
    rng_devices: list[int] = []
    if dev.type == "cuda":
        rng_devices = [dev.index if dev.index is not None else torch.cuda.current_device()]
    try:
        with torch.random.fork_rng(devices=rng_devices):
            torch.manual_seed(seed)
            for p, _ in flags:
                p.requires_grad_(True)
            model.to(dev).train()
            result = _loop(model, data, dev, precision, total, batch_size, lr=lr,
                           warmup_ratio=warmup_ratio, weight_decay=weight_decay, max_grad_norm=max_grad_norm,
                           seed=seed, progress=progress, should_cancel=should_cancel,
                           loss_fn=_loss_fn(teacher, alpha, temperature, dev), auxiliary_loss=auxiliary_loss)
            return _described(result, teacher, alpha, temperature)
    finally:
        model.eval()
        for p, flag in flags:
            p.grad = None
            p.requires_grad_(flag)


#: ``loss_fn(logits, labels, row_indices) -> loss`` of one batch.
LossFn = Callable[[torch.Tensor, torch.Tensor, np.ndarray], torch.Tensor]
#: ``auxiliary_loss(outputs, batch) -> loss`` added to a batch's loss (see :func:`finetune`).
AuxiliaryLoss = Callable[[Any, dict[str, torch.Tensor]], torch.Tensor]


def _loss_fn(teacher: TeacherLogits | None, alpha: float, temperature: float, dev: torch.device) -> LossFn:
    if teacher is None:
        # The loss in fp32: half-precision cross-entropy loses the small differences late in training.
        return lambda logits, labels, _rows: F.cross_entropy(logits.float(), labels)
    return lambda logits, labels, rows: distillation_loss(logits, teacher.rows(rows, dev), labels, alpha=alpha,
                                                          temperature=temperature)


def _described(result: TrainingResult, teacher: TeacherLogits | None, alpha: float,
               temperature: float) -> TrainingResult:
    """``result`` with the loss it was trained with."""
    if teacher is None:
        return result
    return dataclasses.replace(result, loss="distill", alpha=float(alpha), temperature=float(temperature),
                               teacher=teacher.record)


def _loop(model: nn.Module, data: EncodedDataset, dev: torch.device, precision: str, total: int,
          batch_size: int, *, lr: float, warmup_ratio: float, weight_decay: float, max_grad_norm: float,
          seed: int, progress: Callable[[int, int], None] | None,
          should_cancel: Callable[[], bool] | None, loss_fn: LossFn,
          auxiliary_loss: AuxiliaryLoss | None = None) -> TrainingResult:
    optimizer = torch.optim.AdamW(_param_groups(model, weight_decay), lr=lr)
    scheduler = get_linear_schedule_with_warmup(optimizer, math.ceil(warmup_ratio * total), total)
    scaler = torch.amp.GradScaler("cuda") if precision == "fp16" else None
    autocast: Callable[[], contextlib.AbstractContextManager[Any]] = (
        (lambda: torch.autocast("cuda", dtype=torch.bfloat16 if precision == "bf16" else torch.float16))
        if dev.type == "cuda" else contextlib.nullcontext
    )
    batches_per_epoch = math.ceil(len(data) / batch_size)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    losses: list[float] = []
    seconds: list[float] = []
    step = 0
    start = time.perf_counter()
    for epoch in range(math.ceil(total / batches_per_epoch)):
        epoch_start = time.perf_counter()
        batches = length_grouped_batches(data.lengths, np.arange(len(data)), batch_size,
                                         shuffle_seed=_epoch_seed(seed, epoch))
        batches = batches[: total - step]
        loss_sum = 0.0
        for rows, batch in zip(batches, iterate_batches(data, batches, dev), strict=True):
            if should_cancel is not None and should_cancel():
                raise JobCancelledError(f"fine-tuning was cancelled after {step} of {total} steps")
            with autocast():
                if auxiliary_loss is None:
                    outputs = model(**model_inputs(model, batch))
                else:
                    outputs = model(**model_inputs(model, batch), output_hidden_states=True)
            loss = loss_fn(outputs.logits, batch["labels"], rows)
            if auxiliary_loss is not None:
                loss = loss + auxiliary_loss(outputs, batch)
            value = float(loss.detach())  # one sync per step, needed for the NaN check anyway
            if not math.isfinite(value):
                raise PipelineError(
                    f"the training loss became {value} at step {step + 1} of {total}; lower the learning "
                    f"rate (now {optimizer.defaults['lr']:g}) or check the model's weights for NaN/inf"
                )
            optimizer.zero_grad(set_to_none=True)
            if scaler is None:
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
                optimizer.step()
                scheduler.step()
            else:
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
                scaler.step(optimizer)
                scaler.update()
                with warnings.catch_warnings():
                    # A step skipped for fp16 overflow makes torch warn that the schedule moved
                    # before the optimiser; like the Trainer, keep the schedule on the step count.
                    warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)`")
                    scheduler.step()
            step += 1
            loss_sum += value
            if progress is not None:
                progress(step, total)
        losses.append(loss_sum / len(batches))
        seconds.append(time.perf_counter() - epoch_start)
    return TrainingResult(
        steps=step,
        epochs=step / batches_per_epoch,
        loss_per_epoch=tuple(losses),
        wall_s=time.perf_counter() - start,
        seconds_per_epoch=tuple(seconds),
        device=str(dev),
        precision=precision,
    )
