"""What a fine-tuning did: :class:`TrainingResult` and its parts, made by :mod:`cahp_engine.recovery._training`,
:mod:`cahp_engine.recovery._distillation`. Light: importable without torch
or numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

from cahp_engine.results import JsonRecord, ValidationPoint


@dataclass(frozen=True)
class TrainingResult(JsonRecord):
    """What one fine-tuning run did.

    ``epochs`` is the number of passes over the data actually made (``steps`` over the batches of
    one epoch). ``loss_per_epoch`` and ``seconds_per_epoch`` have one entry per epoch begun, the
    last one possibly partial. ``precision`` is ``bf16``, ``fp16`` (with loss scaling) or ``fp32``.
    """

    steps: int
    epochs: float
    loss_per_epoch: tuple[float, ...]
    wall_s: float
    seconds_per_epoch: tuple[float, ...]
    device: str
    precision: str
    #: ``ce`` (cross-entropy with the labels) or ``distill`` (see :mod:`cahp_engine.recovery._distillation`).
    loss: str = "ce"
    #: The distillation loss's weight of the labels and its temperature (None for ``ce``).
    alpha: float | None = None
    temperature: float | None = None
    #: The teacher's pass over the training split (None for ``ce``).
    teacher: TeacherRecord | None = None
    #: Each class's weight in the loss (class-balanced recovery), None when every class weighs 1.
    class_weights: tuple[float, ...] | None = None
    #: The evaluations on the validation split, in order (the first before training); empty when the
    #: fine-tuning watched no validation split (the paper's fixed epochs).
    validation: tuple[ValidationPoint, ...] = ()
    #: The evaluation whose weights were kept and returned: its step and epoch (None without validation).
    best_step: int | None = None
    best_epoch: float | None = None
    #: True when ``early_stopping_patience`` evaluations in a row brought no gain and training stopped
    #: before its last step (or when an accuracy budget's search stopped it: see ``budget.candidates``).
    stopped_early: bool = False
    #: Evaluations without gain that stop the fine-tuning (0: never stops early).
    early_stopping_patience: int = 0


@dataclass(frozen=True)
class TeacherRecord(JsonRecord):
    """The teacher's logits over the training split: ``passes`` forward passes over ``rows`` rows."""

    passes: int
    rows: int
    seconds: float
