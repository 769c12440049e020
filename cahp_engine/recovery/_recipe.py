"""The recipe of a fine-tuning: :class:`TrainingRecipe`, and its parameter groups, batch-order seeds,
precision and loss.

Shared by :class:`~cahp_engine.recovery.FineTuning` (the loop) and its callers; no training here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from cahp_engine._validation import Interval, check
from cahp_engine.recovery._distillation import Distillation, distillation_loss
from cahp_engine.recovery._training_records import TrainingResult

__all__ = ["AuxiliaryLoss", "LossFn", "TrainingRecipe", "balanced_class_weights", "described", "epoch_seed",
           "loss_fn", "param_groups", "precision_for"]

#: ``loss_fn(logits, labels, row_indices) -> loss`` of one batch.
LossFn = Callable[[torch.Tensor, torch.Tensor, np.ndarray], torch.Tensor]
#: ``auxiliary_loss(outputs, batch) -> loss`` added to a batch's loss (see :class:`TrainingRecipe`).
AuxiliaryLoss = Callable[[Any, dict[str, torch.Tensor]], torch.Tensor]


@dataclass(frozen=True)
class TrainingRecipe:
    """How :func:`~cahp_engine.recovery.finetune` trains: AdamW with a linear warm-up and decay, and its loss.

    Attributes
    ----------
    epochs : float >= 0
        Passes over the data; a fraction runs that share of one epoch's batches (0.25 is a quarter),
        and 0 trains nothing: the fine-tuning returns at once without touching the model.
    lr : float > 0
    batch_size : int >= 1
    warmup_ratio : float in [0, 1]
        Warm-up lasts ``ceil(warmup_ratio * steps)`` steps.
    weight_decay : float >= 0
        Skips biases and LayerNorm weights.
    max_grad_norm : float > 0
    seed : int
        Seeds the batch order (a different order each epoch) and dropout; the caller's global torch
        random state is left as it was.
    device : str or torch.device
        Where the model trains (and stays). On CUDA the forward pass runs under bf16 autocast, or fp16
        with loss scaling where bf16 is not supported; on CPU in fp32.
    distillation : Distillation, optional
        A teacher's logits for every training row: the loss becomes
        :func:`~cahp_engine.recovery.distillation_loss` (otherwise plain cross-entropy).
    class_weights : ndarray of shape (C,), optional
        Each class's weight in the loss (:func:`balanced_class_weights` for class-balanced recovery).
    auxiliary_loss : callable (outputs, batch) -> scalar tensor, optional
        A term added to every batch's loss, given the model's outputs (with ``hidden_states``: the
        forward pass then returns them) and the batch on ``device``. For experiments such as matching
        a teacher's hidden states (``python -m studies distill-study``); runs and jobs do not use it.

    References
    ----------
    Paper Section IV-B.5: recovery fine-tuning for 3 epochs at lr 2e-5, linear decay with 10%
    warm-up, weight decay 0.01, max gradient norm 1.0, batch size 32.
    """

    epochs: float
    lr: float
    batch_size: int
    warmup_ratio: float
    weight_decay: float
    max_grad_norm: float
    seed: int
    device: torch.device | str = "cpu"
    distillation: Distillation | None = None
    class_weights: np.ndarray | None = None
    auxiliary_loss: AuxiliaryLoss | None = None

    def __post_init__(self) -> None:
        # Only what would make training meaningless (a negative epoch count, a zero learning rate...).
        # `PruningConfig`, the boundary of commands and jobs, adds upper bounds (lr <= 1, epochs <= 1000,
        # batch_size <= 4096) that catch typos there; a caller of `finetune` may go further.
        check("epochs", self.epochs, Interval("real", 0, None, closed="left"))
        check("lr", self.lr, Interval("real", 0, None, closed="neither"))
        check("batch_size", self.batch_size, Interval("integer", 1, None, closed="left"))
        check("warmup_ratio", self.warmup_ratio, Interval("real", 0, 1))
        check("weight_decay", self.weight_decay, Interval("real", 0, None, closed="left"))
        check("max_grad_norm", self.max_grad_norm, Interval("real", 0, None, closed="neither"))


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


def loss_fn(distillation: Distillation | None, dev: torch.device, weights: torch.Tensor | None) -> LossFn:
    if distillation is None:
        # The loss in fp32: half-precision cross-entropy loses the small differences late in training.
        return lambda logits, labels, _rows: F.cross_entropy(logits.float(), labels, weight=weights)
    teacher, alpha, temperature = distillation.teacher, distillation.alpha, distillation.temperature
    return lambda logits, labels, rows: distillation_loss(logits, teacher.rows(rows, dev), labels, alpha=alpha,
                                                          temperature=temperature, class_weights=weights)


def described(result: TrainingResult, distillation: Distillation | None) -> TrainingResult:
    """``result`` with the loss it was trained with."""
    if distillation is None:
        return result
    return dataclasses.replace(result, loss="distill", alpha=float(distillation.alpha),
                               temperature=float(distillation.temperature), teacher=distillation.teacher.record)
