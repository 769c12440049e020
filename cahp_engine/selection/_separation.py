"""Jeffries-Matusita separation features of every head.

References
----------
Paper Section III-C, Eq. 1-2.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from cahp_engine.selection._signatures import Signatures


@dataclass(frozen=True)
class SeparationFeatures:
    """The global feature matrix X of the paper.

    Attributes
    ----------
    matrix : ndarray of shape (N, P * B * B), float64
        Row ``n = l * H + h``; the columns hold one block of B * B JM distances per class pair, the
        pairs in ``itertools.combinations(range(C), 2)`` order. Values lie in [0, 2].
    pairs : tuple of (int, int)
        The class pairs, in column-block order.
    var_floor : float
        The variance floor that was applied.
    """

    matrix: np.ndarray
    pairs: tuple[tuple[int, int], ...]
    var_floor: float


def bhattacharyya_normal(mu1: np.ndarray, var1: np.ndarray, mu2: np.ndarray, var2: np.ndarray) -> np.ndarray:
    """Bhattacharyya distance between two univariate normals, element-wise (paper Eq. 1).

    ``B = (mu1 - mu2)^2 / (4 (var1 + var2)) + 0.5 * ln((var1 + var2) / (2 sqrt(var1 var2)))``;
    variances must be positive.
    """
    total = var1 + var2
    return 0.25 * (mu1 - mu2) ** 2 / total + 0.5 * np.log(total / (2.0 * np.sqrt(var1 * var2)))


def jeffries_matusita(bhattacharyya: np.ndarray) -> np.ndarray:
    """JM distance ``2 (1 - exp(-B))`` in [0, 2] (paper Eq. 2)."""
    return 2.0 * (1.0 - np.exp(-bhattacharyya))


def separation_features(signatures: Signatures, *, var_floor: float = 1e-10) -> SeparationFeatures:
    """JM distance of every head, pixel and class pair.

    Parameters
    ----------
    signatures : Signatures
        Means and variances of shape (C, N, B * B).
    var_floor : float
        Variances below it are raised to it. A pixel whose value never changes within two classes
        then gets JM = 0 when the class means agree and JM close to 2 when they differ, instead of a
        division by zero.

    Returns
    -------
    SeparationFeatures

    References
    ----------
    Paper Section III-C, Eq. 1-2.
    """
    mean = signatures.mean
    var = np.maximum(signatures.var, var_floor)
    pairs = tuple(itertools.combinations(range(signatures.num_classes), 2))
    blocks = [
        jeffries_matusita(bhattacharyya_normal(mean[i], var[i], mean[j], var[j])) for i, j in pairs
    ]  # each (N, B*B)
    matrix = np.concatenate(blocks, axis=1) if blocks else np.zeros((mean.shape[1], 0))
    return SeparationFeatures(matrix=matrix, pairs=pairs, var_floor=var_floor)
