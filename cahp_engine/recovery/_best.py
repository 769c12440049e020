"""Keeping the best weights of a fine-tuning, and stopping it once it no longer gains.

A fine-tuning that watches a validation split evaluates before its first step and then at every
evaluation step (:class:`~cahp_engine.recovery.FineTuning`); :class:`BestWeights` keeps a CPU copy of
the weights of the best evaluation so far and counts the evaluations since it. The best is the
highest ``rank`` (by default: an evaluation that loses no class the dense model recalled, then the
higher score), so the weights handed back are never ranked below the model the fine-tuning started
from, which is itself the first evaluation.

References
----------
Hugging Face Trainer's ``load_best_model_at_end`` and ``EarlyStoppingCallback`` (patience counted in
evaluations without improvement).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from cahp_engine._validation import Interval, check
from cahp_engine.results import ValidationPoint

__all__ = ["BestWeights", "Rank", "ValidationWatch", "Validator", "default_rank"]

#: ``validate(model, step, epoch) -> ValidationPoint``: scores ``model`` (in place, no training) on
#: the validation split; the fine-tuning passes how far it got.
Validator = Callable[[nn.Module, int, float], ValidationPoint]
#: ``rank(point) -> key``: the larger key is the better evaluation.
Rank = Callable[[ValidationPoint], tuple[Any, ...]]


def default_rank(point: ValidationPoint) -> tuple[bool, float]:
    """An evaluation that loses no class first, then the higher score."""
    return (not point.lost_classes, point.score)


@dataclass(frozen=True)
class ValidationWatch:
    """The validation split a fine-tuning watches: when it evaluates, which evaluation is best, when it stops.

    Attributes
    ----------
    validate : callable (model, step, epoch) -> ValidationPoint
        Scores the model on a validation split: before the first step, every ``eval_steps`` steps
        (0: at every epoch's end) and after the last. The weights of the best evaluation (``rank``)
        are kept and handed back, so the result never ranks below the model it started from.
    early_stopping_patience : int >= 0
        Stop once this many evaluations in a row brought no better rank (0: train every step).
    eval_steps : int >= 0
    rank : callable (ValidationPoint) -> key, optional
        Orders evaluations (default :func:`default_rank`: no class lost, then the score).
    """

    validate: Validator
    early_stopping_patience: int = 0
    eval_steps: int = 0
    rank: Rank | None = None

    def __post_init__(self) -> None:
        check("early_stopping_patience", self.early_stopping_patience, Interval("integer", 0, None, closed="left"))
        check("eval_steps", self.eval_steps, Interval("integer", 0, None, closed="left"))


class BestWeights:
    """The best evaluation of a fine-tuning so far, its weights, and the evaluations since.

    Parameters
    ----------
    patience : int >= 0
        Evaluations in a row without a better rank after which :attr:`exhausted` is True (0: never).
    rank : callable, optional
        Orders evaluations (:func:`default_rank`).
    """

    def __init__(self, patience: int, rank: Rank | None = None) -> None:
        self.patience = patience
        self.rank: Rank = rank or default_rank
        self.curve: list[ValidationPoint] = []
        self.best: int | None = None
        self.since_best = 0
        self._weights: dict[str, torch.Tensor] | None = None

    def observe(self, model: nn.Module, point: ValidationPoint) -> bool:
        """Record ``point``; keep ``model``'s weights when it is the best so far. True when it is."""
        self.curve.append(point)
        if self.best is not None and self.rank(point) <= self.rank(self.curve[self.best]):
            self.since_best += 1
            return False
        self.best = len(self.curve) - 1
        self.since_best = 0
        # A CPU copy: a GPU holds the model, its optimiser state and this copy otherwise.
        self._weights = {name: value.detach().to("cpu", copy=True) for name, value in model.state_dict().items()}
        return True

    @property
    def exhausted(self) -> bool:
        """``patience`` evaluations in a row have brought no better rank."""
        return self.patience > 0 and self.since_best >= self.patience

    @property
    def best_point(self) -> ValidationPoint | None:
        return None if self.best is None else self.curve[self.best]

    def restore(self, model: nn.Module) -> None:
        """Load the best weights into ``model`` (in place, on its device)."""
        if self._weights is not None:
            model.load_state_dict(self._weights)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to go on later (:meth:`load_state_dict`)."""
        return {"curve": [p.to_dict() for p in self.curve], "best": self.best, "since_best": self.since_best,
                "weights": self._weights}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.curve = [ValidationPoint.from_dict(p) for p in state["curve"]]
        self.best, self.since_best, self._weights = state["best"], state["since_best"], state["weights"]
