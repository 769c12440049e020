"""The recipe of a fine-tuning: its checks, parameter groups, batch-order seeds, precision and loss.

Shared by :class:`~cahp_engine.recovery.FineTuning` (the loop) and its callers; no training here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from cahp_engine._validation import Interval, check
from cahp_engine.recovery._distillation import TeacherLogits, distillation_loss
from cahp_engine.recovery._training_records import TrainingResult

__all__ = ["AuxiliaryLoss", "LossFn", "balanced_class_weights", "check_recipe", "described", "epoch_seed", "loss_fn",
           "param_groups", "precision_for"]


def check_recipe(epochs: float, lr: float, batch_size: int, warmup_ratio: float, weight_decay: float,
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


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
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


def epoch_seed(seed: int, epoch: int) -> int:
    # A SeedSequence keeps (seed, epoch) pairs apart; seed + epoch would give seed 1 epoch 0 the
    # same batch order as seed 0 epoch 1.
    return int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0])


def precision_for(dev: torch.device) -> str:
    if dev.type != "cuda":
        return "fp32"
    return "bf16" if torch.cuda.is_bf16_supported() else "fp16"


#: ``loss_fn(logits, labels, row_indices) -> loss`` of one batch.
LossFn = Callable[[torch.Tensor, torch.Tensor, np.ndarray], torch.Tensor]
#: ``auxiliary_loss(outputs, batch) -> loss`` added to a batch's loss (see :func:`finetune`).
AuxiliaryLoss = Callable[[Any, dict[str, torch.Tensor]], torch.Tensor]


def balanced_class_weights(labels: np.ndarray, num_classes: int) -> np.ndarray:
    """scikit-learn's ``class_weight="balanced"``: ``n / (C * n_c)`` for each class ``c`` of ``labels``.

    Parameters
    ----------
    labels : ndarray of shape (n,)
        Class indices in ``[0, num_classes)``.
    num_classes : int
        C; a class without rows gets weight 1 (it never weighs a loss).

    Returns
    -------
    ndarray of shape (num_classes,), float64
    """
    counts = np.bincount(np.asarray(labels, dtype=np.int64), minlength=num_classes).astype(np.float64)
    present = counts > 0
    weights = np.ones(num_classes)
    weights[present] = counts.sum() / (present.sum() * counts[present])
    return weights


def loss_fn(teacher: TeacherLogits | None, alpha: float, temperature: float, dev: torch.device,
             weights: torch.Tensor | None) -> LossFn:
    if teacher is None:
        # The loss in fp32: half-precision cross-entropy loses the small differences late in training.
        return lambda logits, labels, _rows: F.cross_entropy(logits.float(), labels, weight=weights)
    return lambda logits, labels, rows: distillation_loss(logits, teacher.rows(rows, dev), labels, alpha=alpha,
                                                          temperature=temperature, class_weights=weights)


def described(result: TrainingResult, teacher: TeacherLogits | None, alpha: float,
               temperature: float) -> TrainingResult:
    """``result`` with the loss it was trained with."""
    if teacher is None:
        return result
    return dataclasses.replace(result, loss="distill", alpha=float(alpha), temperature=float(temperature),
                               teacher=teacher.record)
