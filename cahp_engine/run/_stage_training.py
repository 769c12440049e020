"""What one stage of a run fine-tunes with, beyond the recipe every stage shares.

:func:`cahp_engine.run._steps.train_model` takes the run's shared recipe (batch, warm-up, decay, clipping,
seed) from its :class:`~cahp_engine.run._steps.RunContext`, and the rest from a :class:`StageTraining`:
the dense fine-tuning gives a stage, its epochs and rate; recovery adds its loss (a teacher, class weights)
and the validation split it watches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cahp_engine.recovery import TeacherLogits, Validator


@dataclass(frozen=True)
class StageTraining:
    """One stage's fine-tuning.

    Attributes
    ----------
    stage : str
        The progress stage it reports in, and the name its resume state is kept under.
    epochs : float
        Passes over the training rows (0: none).
    lr : float
    teacher : TeacherLogits, optional
        The dense model's logits: the loss becomes the distillation loss.
    class_weights : ndarray of shape (C,), optional
        Each class's weight in the loss.
    validate : Validator, optional
        Scores the model on the validation split: the best weights are kept and early stopping applies.
    """

    stage: str
    epochs: float
    lr: float
    teacher: TeacherLogits | None = None
    class_weights: np.ndarray | None = None
    validate: Validator | None = None
