"""Locating k* at the knee of the MSS curve with Kneedle on a polynomial fit.

References
----------
Paper Section III-D and Section IV-B.2 (Kneedle with polynomial fitting, degrees 2..6).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from kneed import KneeLocator


@dataclass(frozen=True)
class Knee:
    """The knee of one polynomial degree.

    Attributes
    ----------
    k : int
        The chosen k (the fallback's when Kneedle found none).
    degree : int
    found : bool
        False when Kneedle found no knee and :func:`chord_knee` chose ``k``.
    warning : str or None
    """

    k: int
    degree: int
    found: bool
    warning: str | None = None


def chord_knee(ks: np.ndarray, mss: np.ndarray) -> int:
    """Fallback knee: the k whose min-max normalised MSS lies farthest above the chord.

    This is Kneedle's difference curve on the raw (unsmoothed) data, whose maximum always exists;
    for a flat curve it returns the first k.
    """
    x = (ks - ks.min()) / max(float(ks.max() - ks.min()), 1e-12)
    span = float(mss.max() - mss.min())
    y = (mss - mss.min()) / span if span > 0 else np.zeros_like(mss)
    return int(ks[int(np.argmax(y - x))])


def find_knee(ks: Sequence[int] | np.ndarray, mss: Sequence[float] | np.ndarray, *, degree: int) -> Knee:
    """Kneedle (concave, increasing) on a degree-``degree`` polynomial fit of the MSS curve.

    Parameters
    ----------
    ks : array-like of shape (K,)
    mss : array-like of shape (K,)
    degree : int
        Polynomial degree; higher degrees follow the curve more closely.

    Returns
    -------
    Knee
        Never raises for a curve of two or more points: when no knee exists the fallback rule of
        :func:`chord_knee` is used and a warning is recorded.
    """
    x = np.asarray(ks, dtype=np.int64)
    y = np.asarray(mss, dtype=np.float64)
    if len(x) < 2:
        raise ValueError("the MSS curve needs at least two points to have a knee")
    knee = None
    if len(x) >= 3 and np.ptp(y) > 0:
        with warnings.catch_warnings():
            # kneed warns (UserWarning) when it finds no knee; that case is handled below.
            warnings.simplefilter("ignore")
            locator = KneeLocator(
                x,
                y,
                curve="concave",
                direction="increasing",
                interp_method="polynomial",
                polynomial_degree=degree,
            )
            knee = locator.knee
    if knee is not None:
        return Knee(k=int(knee), degree=degree, found=True)
    fallback = chord_knee(x, y)
    return Knee(
        k=fallback,
        degree=degree,
        found=False,
        warning=(
            f"Kneedle found no knee with polynomial degree {degree}; used the point of the MSS curve "
            f"farthest above its chord instead (k={fallback})"
        ),
    )


def knees_by_degree(
    ks: Sequence[int] | np.ndarray, mss: Sequence[float] | np.ndarray, degrees: Sequence[int]
) -> dict[int, Knee]:
    """:func:`find_knee` for each degree, from the same curve."""
    return {int(d): find_knee(ks, mss, degree=int(d)) for d in degrees}
