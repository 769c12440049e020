"""FasterPAM clustering of the graph space for every k, scored by the Mean Simplified Silhouette.

References
----------
Paper Section III-D, Eq. 3-5, and Section IV-B.2 (FasterPAM).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import kmedoids
import numpy as np
from scipy.spatial.distance import cdist


@dataclass(frozen=True)
class Clustering:
    """One k-medoids partition: ``labels[i]`` indexes ``medoids`` (point indices)."""

    k: int
    medoids: np.ndarray
    labels: np.ndarray
    mss: float


@dataclass(frozen=True)
class MssCurve:
    """The MSS of the FasterPAM clustering at every k.

    Attributes
    ----------
    ks : ndarray of shape (K,), int
    mss : ndarray of shape (K,), float64
    clusterings : tuple of Clustering, one per k, in ``ks`` order
    """

    ks: np.ndarray
    mss: np.ndarray
    clusterings: tuple[Clustering, ...]

    def at(self, k: int) -> Clustering:
        """The clustering for ``k``."""
        index = int(np.searchsorted(self.ks, k))
        if index >= len(self.ks) or self.ks[index] != k:
            raise KeyError(f"k={k} is not in the sweep ({int(self.ks[0])}..{int(self.ks[-1])})")
        return self.clusterings[index]


def mean_simplified_silhouette(distances: np.ndarray, medoids: np.ndarray, labels: np.ndarray) -> float:
    """Mean Simplified Silhouette of a medoid partition (paper Eq. 3-5).

    Parameters
    ----------
    distances : ndarray of shape (N, N)
    medoids : ndarray of shape (k,), point indices, k >= 2
    labels : ndarray of shape (N,), index into ``medoids`` of each point's cluster

    Returns
    -------
    float
        The mean over non-medoid points of ``1 - a / b``, where ``a`` is the distance to the own
        medoid and ``b`` the mean distance to the other medoids. A point with ``b = 0`` scores 0.
    """
    k = len(medoids)
    to_medoids = distances[:, medoids]  # (N, k)
    rows = np.arange(distances.shape[0])
    a = to_medoids[rows, labels]
    b = (to_medoids.sum(axis=1) - a) / (k - 1)
    keep = np.ones(distances.shape[0], dtype=bool)
    keep[medoids] = False
    if not keep.any():
        return 0.0
    a, b = a[keep], b[keep]
    scores = np.where(b > 0, 1.0 - a / np.where(b > 0, b, 1.0), 0.0)
    return float(scores.mean())


def cluster(distances: np.ndarray, k: int, *, seed: int) -> Clustering:
    """FasterPAM with ``k`` medoids, seeded, single-threaded (repeatable on any machine)."""
    result = kmedoids.fasterpam(distances, medoids=k, random_state=seed, n_cpu=1)
    medoids = np.asarray(result.medoids, dtype=np.int64)
    labels = np.asarray(result.labels, dtype=np.int64)
    mss = mean_simplified_silhouette(distances, medoids, labels) if k >= 2 else 0.0
    return Clustering(k=k, medoids=medoids, labels=labels, mss=mss)


def mss_sweep(
    points: np.ndarray,
    ks: Sequence[int] | None = None,
    *,
    seed: int,
    on_k: Callable[[int], None] | None = None,
) -> MssCurve:
    """Cluster ``points`` for every k and score each partition.

    Parameters
    ----------
    points : ndarray of shape (N, 2)
        The graph space.
    ks : sequence of int, optional
        Defaults to 2..N-1 (k = N, every head its own medoid, is trivial and left out).
    seed : int
        FasterPAM's ``random_state`` for every k.
    on_k : callable, optional
        Called after each k (progress, cancellation).

    Returns
    -------
    MssCurve

    References
    ----------
    Paper Algorithm 1 lines 5-8, Eq. 3-5.
    """
    n = points.shape[0]
    ks = list(range(2, n)) if ks is None else [int(k) for k in ks]
    if not ks or min(ks) < 2 or max(ks) > n - 1:
        raise ValueError(f"every k must lie in 2..{n - 1} for {n} points")
    distances = cdist(points, points)
    clusterings = []
    for k in ks:
        clusterings.append(cluster(distances, k, seed=seed))
        if on_k is not None:
            on_k(k)
    return MssCurve(
        ks=np.asarray(ks, dtype=np.int64),
        mss=np.asarray([c.mss for c in clusterings], dtype=np.float64),
        clusterings=tuple(clusterings),
    )
