"""How far a pruned model's validation score fell below the dense model's, and how sure that figure is.

The drop is scored on one split of n rows, so it carries that split's noise: on SST-5's 1,101
validation rows one accuracy has a standard error of about 1.5 points. The paired bootstrap resamples
the rows with replacement and scores the dense model's and the candidate's predictions on the same
resampled rows, so the noise both share (hard rows, easy rows) cancels and what is left is the
noise of their difference. Every call with the same ``seed`` and n draws the same resamples, so the
intervals of two candidates scored on one split are comparable.

References
----------
Efron and Tibshirani, "An Introduction to the Bootstrap" (1993), Chapter 13 (percentile intervals);
Koehn, "Statistical Significance Tests for Machine Translation Evaluation" (2004), the paired bootstrap.
"""

from __future__ import annotations

import numpy as np

from cahp_engine._validation import Interval, check
from cahp_engine.errors import InvalidInputError
from cahp_engine.results import DropInterval

__all__ = ["BOOTSTRAP_RESAMPLES", "drop_interval", "metric_of_predictions"]

#: Resamples of the paired bootstrap: the 2.5 % and 97.5 % quantiles then rest on 50 resamples each.
BOOTSTRAP_RESAMPLES = 2000
_CHUNK = 200  # resamples scored at once: a (200, n) index array


def metric_of_predictions(y_true: np.ndarray, y_pred: np.ndarray, num_classes: int, metric: str) -> np.ndarray:
    """Accuracy or macro-F1 of each row of predictions, as :func:`~cahp_engine.recovery.evaluate` scores them.

    Parameters
    ----------
    y_true, y_pred : ndarray of shape (B, n)
        Labels and predictions of B resamples (or B = 1: one split).
    num_classes : int
        C; predictions and labels lie in ``[0, C)``.
    metric : {"accuracy", "macro_f1"}

    Returns
    -------
    ndarray of shape (B,)
        Macro-F1 averages over the classes that occur in the labels or the predictions of that row
        (scikit-learn's default), counting an undefined F1 as 0.
    """
    if metric == "accuracy":
        return (y_true == y_pred).mean(axis=1)
    b = y_true.shape[0]
    codes = (np.arange(b)[:, None] * num_classes + y_true) * num_classes + y_pred
    confusion = np.bincount(codes.ravel(), minlength=b * num_classes * num_classes).reshape(b, num_classes,
                                                                                             num_classes)
    hits = np.diagonal(confusion, axis1=1, axis2=2).astype(np.float64)
    both = confusion.sum(axis=2) + confusion.sum(axis=1)  # support + predicted
    present = both > 0
    f1 = np.divide(2.0 * hits, both, out=np.zeros_like(hits), where=present)
    return f1.sum(axis=1) / np.maximum(present.sum(axis=1), 1)


def drop_interval(
    y_true: np.ndarray,
    dense_pred: np.ndarray,
    candidate_pred: np.ndarray,
    *,
    num_classes: int,
    metric: str,
    seed: int,
    resamples: int = BOOTSTRAP_RESAMPLES,
    confidence: float | None = None,
) -> DropInterval:
    """The drop ``dense - candidate`` of ``metric`` in points, with its 95 % paired-bootstrap interval.

    Parameters
    ----------
    y_true, dense_pred, candidate_pred : ndarray of shape (n,)
        The split's labels and both models' predictions, row for row.
    num_classes : int
    metric : {"accuracy", "macro_f1"}
    seed : int
        Seeds the resamples (the same for every candidate of a run).
    resamples : int >= 100
    confidence : float in (0.5, 1), optional
        Also the one-sided upper bound of the drop at this confidence (``upper``).

    Returns
    -------
    DropInterval
        Percentile interval of the resampled drops; ``drop`` itself is on the whole split.
    """
    check("resamples", resamples, Interval("integer", 100, None, closed="left"))
    y, d, c = (np.asarray(a, dtype=np.int64) for a in (y_true, dense_pred, candidate_pred))
    if not (y.ndim == d.ndim == c.ndim == 1 and len(y) == len(d) == len(c) and len(y) > 0):
        raise InvalidInputError(f"the drop's bootstrap needs one label and two predictions per row, got "
                                f"{y.shape}, {d.shape} and {c.shape}")
    if metric not in ("accuracy", "macro_f1"):
        raise InvalidInputError(f"`metric` must be one of accuracy, macro_f1, got {metric!r}")
    n = len(y)

    def score(pred: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return metric_of_predictions(y[rows], pred[rows], num_classes, metric)

    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xB0075]))
    drops: list[np.ndarray] = []
    for done in range(0, resamples, _CHUNK):
        rows = rng.integers(0, n, size=(min(_CHUNK, resamples - done), n))
        drops.append(score(d, rows) - score(c, rows))
    sample = 100.0 * np.concatenate(drops)
    whole = np.arange(n)[None, :]
    drop = float(100.0 * (score(d, whole)[0] - score(c, whole)[0]))
    low, high = (float(v) for v in np.quantile(sample, [0.025, 0.975]))
    upper = None if confidence is None else float(np.quantile(sample, confidence))
    return DropInterval(drop=drop, low=low, high=high, half_width=(high - low) / 2.0, resamples=int(resamples),
                        confidence=confidence, upper=upper)
