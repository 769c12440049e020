"""What one stage of a run fine-tunes with, beyond the recipe every stage shares.

:func:`run_recipe` is the run's :class:`~cahp_engine.recovery.TrainingRecipe` as its config says it (batch,
warm-up, decay, clipping, seed, the recovery's epochs and rate) on the run's device; a :class:`StageTraining`
says the rest: the dense fine-tuning gives a stage, its epochs and rate; recovery adds its loss (a teacher,
class weights) and the validation split it watches. :func:`cahp_engine.run._steps.train_model` joins the two.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from cahp_engine.config import PruningConfig
from cahp_engine.recovery import Distillation, TeacherLogits, TrainingRecipe, ValidationWatch, Validator


def run_recipe(config: PruningConfig, device: torch.device) -> TrainingRecipe:
    """The recovery's recipe in ``config`` on ``device``, with cross-entropy (:func:`distillation` for a teacher)."""
    return TrainingRecipe(epochs=config.epochs, lr=config.lr, batch_size=config.batch_size,
                          warmup_ratio=config.warmup_ratio, weight_decay=config.weight_decay,
                          max_grad_norm=config.max_grad_norm, seed=config.seed, device=device)


def distillation(config: PruningConfig, teacher: TeacherLogits | None) -> Distillation | None:
    """``teacher``'s distillation with the run's weight and temperature (None without a teacher)."""
    return None if teacher is None else Distillation(teacher, config.distill_alpha, config.distill_temperature)


def validation_watch(config: PruningConfig, validate: Validator | None) -> ValidationWatch | None:
    """The run's early stopping and evaluation steps over ``validate`` (None without a validation split)."""
    return None if validate is None else ValidationWatch(validate, config.early_stopping_patience, config.eval_steps)


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

    def recipe(self, config: PruningConfig, device: torch.device) -> TrainingRecipe:
        """The run's recipe with this stage's epochs, rate and loss."""
        return dataclasses.replace(run_recipe(config, device), epochs=self.epochs, lr=self.lr,
                                   distillation=distillation(config, self.teacher), class_weights=self.class_weights)
