"""The validation split a run judges recovery on, and how a model is scored on it.

Recovery that keeps its best epoch (``early_stopping_patience``) and the accuracy budget
(``max_accuracy_drop``) both judge on a validation split, never on the evaluation (test) split: the
dataset's own when it has one that is neither the training nor the evaluation split, else a seeded
stratified 10 % carved from the training split, which is then left out of selection and of every
fine-tuning (:func:`validation_data`). :class:`ValidationScorer` scores a model on it in the run's
metric, marks the classes it lost against the dense model, and keeps each evaluation's predictions
for the drop's bootstrap (:func:`~cahp_engine.recovery.drop_interval`). :func:`seen_in_training` says
when carved rows are rows a model fine-tuned before the run has most likely learnt.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from cahp_engine.data import DatasetSplits, EncodedDataset, LabelledTexts, load_splits
from cahp_engine.errors import DatasetError
from cahp_engine.recovery import ClassificationMetrics, classification_metrics, predict
from cahp_engine.results import ValidationPoint
from cahp_engine.run._request import RunRequest

__all__ = ["CARVE_FRACTION", "VALIDATION_SPLITS", "ValidationData", "ValidationScorer", "carve", "score_of",
           "seen_in_training", "validation_data"]

#: Split names taken as a validation split, in this order, when the dataset has one.
VALIDATION_SPLITS: tuple[str, ...] = ("validation", "dev", "valid", "val", "validation_matched")
#: Share of each class carved from the training split when the dataset has no validation split.
CARVE_FRACTION = 0.1
#: Rows a class needs in the training split to be carved: one to validate on, one to train on.
MIN_ROWS_TO_CARVE = 2
#: A dense model scoring at least this many points higher on carved rows than on the evaluation split, and
#: this many standard errors of the difference, has most likely been fine-tuned on those rows.
SEEN_GAP_POINTS, SEEN_GAP_ERRORS = 5.0, 3.0


@dataclass(frozen=True)
class ValidationData:
    """What recovery and the budget score on, and what is left to train on.

    ``train`` is the training split, less the carved rows when ``carved``; ``split`` names the
    validation split (``train`` when carved).
    """

    train: LabelledTexts
    validation: LabelledTexts
    split: str
    carved: bool


def carve(train: LabelledTexts, seed: int, fraction: float = CARVE_FRACTION) -> tuple[LabelledTexts, LabelledTexts]:
    """Split ``train`` into (rest, held-out): ``round(fraction * n_c)`` rows of each class ``c``, at least one.

    Every class with rows must have at least :data:`MIN_ROWS_TO_CARVE` (one to validate on, one to
    train on). The draw is seeded by ``seed`` and independent of every other random choice of the run.

    Raises
    ------
    DatasetError
        When a class has a single row: the message names the classes and the rows needed.
    """
    labels = np.asarray(train.labels)
    counts = np.bincount(labels, minlength=train.num_classes)
    short = [(train.label_names[c] if c < len(train.label_names) else str(c), int(counts[c]))
             for c in range(train.num_classes) if 0 < counts[c] < MIN_ROWS_TO_CARVE]
    if short:
        named = ", ".join(f"{name!r} has {n}" for name, n in short[:5]) + (" ..." if len(short) > 5 else "")
        raise DatasetError(
            f"the training split is too small to carve a validation split from: class {named} row(s), and carving "
            f"needs at least {MIN_ROWS_TO_CARVE} rows of every class (one to validate on, one to train on; "
            f"{CARVE_FRACTION:.0%} of each class is held out). Add a `validation` split to the dataset or more rows of "
            "those classes, or, without an accuracy budget, set `early_stopping_patience` to 0")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xB0D9E7]))
    held: list[np.ndarray] = []
    for c in range(train.num_classes):
        rows = np.flatnonzero(labels == c)
        if len(rows) == 0:
            continue
        take = min(len(rows) - 1, max(1, int(round(fraction * len(rows)))))
        held.append(rng.permutation(rows)[:take])
    out = np.sort(np.concatenate(held))
    rest = np.setdiff1d(np.arange(len(train)), out)
    return train.subset(rest), train.subset(out)


def validation_data(splits: DatasetSplits, request: RunRequest, *, seed: int) -> ValidationData:
    """The run's validation split: the dataset's own when it has one, else carved from train (by ``seed``).

    ``splits`` are the dataset ``request`` names, read as the run reads it (its options, token, cache
    and row limit, at the dataset's default revision). A split of :data:`VALIDATION_SPLITS` qualifies
    when it is neither the training nor the evaluation split; its labels are mapped as the training
    split maps them.
    """
    options = request.dataset_options
    for name in VALIDATION_SPLITS:
        if name in splits.splits_found and name not in (options.train_split, splits.eval_split):
            read = load_splits(request.dataset_ref, dataclasses.replace(options, eval_split=name), revision=None,
                               cache_dir=request.cache_dir, token=request.hub_token,
                               max_rows=request.max_dataset_rows)
            if read.label_names != splits.label_names:
                raise DatasetError(f"split {name!r} maps the labels as {list(read.label_names)} but the training split "
                                   f"as {list(splits.label_names)}; give both splits the same classes")
            return ValidationData(train=splits.train, validation=read.eval, split=name, carved=False)
    rest, held = carve(splits.train, seed)
    return ValidationData(train=rest, validation=held, split=options.train_split, carved=True)


def seen_in_training(validation: ClassificationMetrics, evaluation: ClassificationMetrics, metric: str) -> str | None:
    """A warning when rows carved from the training split are likely rows the dense model was fine-tuned on.

    A model brought already fine-tuned (the run did not fine-tune it) has usually seen every training row,
    the carved ones too: it then scores far higher on them than on the evaluation split, and early stopping
    and the accuracy budget measure each pruned model's drop against rows the dense model learnt by heart
    (a drop serving will not see). Said when the dense model's ``metric`` on ``validation`` is at least
    :data:`SEEN_GAP_POINTS` points and :data:`SEEN_GAP_ERRORS` standard errors (of a difference of two
    proportions) above its ``evaluation`` score; None otherwise.
    """
    here, there = score_of(validation, metric), score_of(evaluation, metric)
    gap = here - there
    error = math.sqrt(here * (1 - here) / max(validation.n, 1) + there * (1 - there) / max(evaluation.n, 1))
    if 100 * gap < SEEN_GAP_POINTS or gap < SEEN_GAP_ERRORS * error:
        return None
    name = "macro-F1" if metric == "macro_f1" else "accuracy"
    return (f"the validation rows were carved from the training split and the dense model scores {100 * here:.1f} % "
            f"{name} on them against {100 * there:.1f} % on the evaluation split ({100 * gap:.1f} points higher): it "
            "has likely been fine-tuned on them, so early stopping and the accuracy budget judge the pruned models "
            "against rows the dense model learnt by heart, and the drop they measure is not the one serving will see; "
            "give the dataset a `validation` split the dense model never trained on")


def score_of(metrics: ClassificationMetrics, metric: str) -> float:
    """The run's metric of ``metrics``, in [0, 1]."""
    return float(metrics.accuracy if metric == "accuracy" else metrics.macro_f1)


@dataclass
class ValidationScorer:
    """Scores a model on the validation split, as :class:`~cahp_engine.recovery.FineTuning` asks it to.

    Parameters
    ----------
    data : EncodedDataset of n rows
        The validation split.
    metric : {"accuracy", "macro_f1"}
    dense : ClassificationMetrics, optional
        The dense model on the same split; a class it recalls (recall > 0) that a scored model recalls
        none of is *lost* (``ValidationPoint.lost_classes``).
    batch_size : int
    device : torch.device

    Attributes
    ----------
    predictions : list of ndarray of shape (n,)
        Every evaluation's predictions, in order (the curve's points).
    """

    data: EncodedDataset
    metric: str
    dense: ClassificationMetrics | None
    batch_size: int
    device: torch.device
    predictions: list[np.ndarray] = field(default_factory=list)

    def score(self, model: nn.Module) -> tuple[ClassificationMetrics, np.ndarray]:
        """The metrics and the predictions of ``model`` on the split (nothing recorded)."""
        predicted = predict(model, self.data, batch_size=self.batch_size, device=self.device)
        return classification_metrics(self.data.labels, predicted, self.data.num_classes), predicted

    def __call__(self, model: nn.Module, step: int, epoch: float) -> ValidationPoint:
        metrics, predicted = self.score(model)
        self.predictions.append(predicted)
        return ValidationPoint(step=int(step), epoch=float(epoch), score=score_of(metrics, self.metric),
                               accuracy=metrics.accuracy, macro_f1=metrics.macro_f1,
                               lost_classes=lost_classes(self.dense, metrics))


def lost_classes(dense: ClassificationMetrics | None, model: ClassificationMetrics) -> tuple[int, ...]:
    """The classes ``dense`` recalls (recall > 0) and ``model`` recalls none of (recall 0)."""
    if dense is None:
        return ()
    return tuple(i for i, (was, now) in enumerate(zip(dense.recall, model.recall, strict=False))
                 if was is not None and now is not None and was > 0.0 and now == 0.0)
