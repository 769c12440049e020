"""Knowledge distillation for recovery: the dense model teaches the pruned one.

The teacher is the dense model the run started from (after dense fine-tuning when that ran). Its
logits over the training split are computed once, in one evaluation pass, and kept as an array, so
no teacher sits in memory while the student trains. The loss is Hinton et al.'s:

.. math::

    \\mathcal{L} = \\alpha\\,\\mathrm{CE}(z_s, y) + (1-\\alpha)\\,T^2\\,
    \\mathrm{KL}\\big(\\mathrm{softmax}(z_t/T)\\,\\|\\,\\mathrm{softmax}(z_s/T)\\big)

with student logits :math:`z_s`, teacher logits :math:`z_t`, temperature :math:`T` (the :math:`T^2`
keeps the soft term's gradients on the scale of the hard one's) and :math:`\\alpha` the weight of
the labels.

References
----------
Hinton, Vinyals and Dean, "Distilling the Knowledge in a Neural Network" (2015), Section 2.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from cahp_engine._torch import as_device, model_inputs
from cahp_engine._validation import Interval, check
from cahp_engine.data import EncodedDataset, iterate_batches, length_grouped_batches
from cahp_engine.recovery._training_records import TeacherRecord

__all__ = ["Distillation", "TeacherLogits", "distillation_loss", "teacher_logits"]


class TeacherLogits:
    """The teacher's logits for every row of a training split, row ``i`` for sample ``i``.

    Attributes
    ----------
    logits : ndarray of shape (n, C), float32
    record : TeacherRecord
        How they were computed (passes, rows, seconds).
    """

    def __init__(self, logits: np.ndarray, record: TeacherRecord) -> None:
        self.logits = logits
        self.record = record

    def rows(self, indices: np.ndarray, device: torch.device) -> torch.Tensor:
        """The logits of the rows ``indices`` as a float32 tensor on ``device``."""
        return torch.from_numpy(self.logits[np.asarray(indices, dtype=np.int64)]).to(device)


@dataclass(frozen=True)
class Distillation:
    """A fine-tuning's teacher: :func:`distillation_loss` with the teacher's logits replaces cross-entropy.

    Attributes
    ----------
    teacher : TeacherLogits
        The teacher's logits for every row of the training data (:func:`teacher_logits`).
    alpha : float in [0, 1]
        Weight of the cross-entropy with the labels; 1 is plain cross-entropy.
    temperature : float > 0
    """

    teacher: TeacherLogits
    alpha: float = 0.5
    temperature: float = 4.0

    def __post_init__(self) -> None:
        check("alpha", self.alpha, Interval("real", 0, 1))
        check("temperature", self.temperature, Interval("real", 0, None, closed="neither"))


def teacher_logits(model: nn.Module, data: EncodedDataset, *, batch_size: int,
                   device: torch.device | str = "cpu") -> TeacherLogits:
    """One forward pass of ``model`` over ``data``, in eval mode under ``no_grad``.

    Returns
    -------
    TeacherLogits
        Float32 logits of shape (n, C), in ``data``'s row order; the model's mode is restored.
    """
    dev = as_device(device)
    started = time.perf_counter()
    was_training = model.training
    model.to(dev).eval()
    out: np.ndarray | None = None
    batches = length_grouped_batches(data.lengths, np.arange(len(data)), batch_size)
    try:
        with torch.no_grad():
            for idx, batch in zip(batches, iterate_batches(data, batches, dev), strict=True):
                logits = model(**model_inputs(model, batch)).logits.float().cpu().numpy()
                if out is None:
                    out = np.empty((len(data), logits.shape[1]), dtype=np.float32)
                out[idx] = logits
    finally:
        model.train(was_training)
    assert out is not None  # data has at least one row (the caller checks)
    record = TeacherRecord(passes=1, rows=len(data), seconds=time.perf_counter() - started)
    return TeacherLogits(out, record)


def distillation_loss(student: torch.Tensor, teacher: torch.Tensor, labels: torch.Tensor, *, alpha: float,
                      temperature: float, class_weights: torch.Tensor | None = None) -> torch.Tensor:
    """``alpha * CE(student, labels) + (1 - alpha) * T^2 * KL(p_teacher^T || p_student^T)``.

    Parameters
    ----------
    student, teacher : Tensor of shape (b, C)
        Logits; computed in float32 whatever their dtype.
    labels : Tensor of shape (b,)
    alpha : float in [0, 1]
        Weight of the cross-entropy with the labels; 1 is plain cross-entropy.
    temperature : float > 0
    class_weights : Tensor of shape (C,), optional
        Each class's weight (class-balanced recovery): both terms become averages over the batch's
        rows weighted by their label's weight, as ``F.cross_entropy(weight=...)`` weighs the first.

    Returns
    -------
    Tensor
        The scalar loss, averaged over the batch.
    """
    student = student.float()
    hard = F.cross_entropy(student, labels, weight=class_weights)
    if alpha >= 1.0:
        return hard
    t = float(temperature)
    if class_weights is None:
        soft = F.kl_div(F.log_softmax(student / t, dim=-1), F.log_softmax(teacher.float() / t, dim=-1),
                        reduction="batchmean", log_target=True)
    else:
        per_row = F.kl_div(F.log_softmax(student / t, dim=-1), F.log_softmax(teacher.float() / t, dim=-1),
                           reduction="none", log_target=True).sum(dim=-1)
        w = class_weights[labels]
        soft = (per_row * w).sum() / w.sum()
    return alpha * hard + (1.0 - alpha) * (t * t) * soft
