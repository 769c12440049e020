"""Choosing the heads to keep: CAHP's cluster representatives, and two baselines.

References
----------
Paper Algorithm 1 lines 10-11 and Section III-D (salience-led representatives, layer safety).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cahp_engine.errors import ConfigError
from cahp_engine.selection._records import ConsensusRecord

Head = tuple[int, int]


@dataclass(frozen=True)
class Selection:
    """Which heads survive.

    Attributes
    ----------
    kept_mask : ndarray of shape (L, H), bool
    representatives : tuple of (layer, head)
        Heads chosen as the most salient member of a cluster (CAHP) or by the baseline rule.
    layer_safety_added : tuple of (layer, head)
        Heads kept only because their layer would otherwise have none.
    strategy : str
    consensus : ConsensusRecord or None
        For a consensus strategy: how the K + 1 analyses it combined agreed (None otherwise).
    """

    kept_mask: np.ndarray
    representatives: tuple[Head, ...]
    layer_safety_added: tuple[Head, ...]
    strategy: str
    consensus: ConsensusRecord | None = None

    @property
    def kept(self) -> dict[int, list[int]]:
        """Original head indices kept, per layer (every layer present, possibly empty)."""
        return {layer: np.flatnonzero(row).tolist() for layer, row in enumerate(self.kept_mask)}

    @property
    def num_kept(self) -> int:
        return int(self.kept_mask.sum())

    @property
    def retention(self) -> float:
        return self.num_kept / self.kept_mask.size


def _as_grid(salience: np.ndarray) -> np.ndarray:
    grid = np.asarray(salience, dtype=np.float64)
    if grid.ndim != 2:
        raise ValueError(f"salience must have shape (L, H), got {grid.shape}")
    return grid


def _layer_safety(mask: np.ndarray, salience: np.ndarray) -> tuple[Head, ...]:
    added: list[Head] = []
    for layer in np.flatnonzero(~mask.any(axis=1)):
        head = int(np.argmax(salience[layer]))
        mask[layer, head] = True
        added.append((int(layer), head))
    return tuple(added)


def select_representatives(labels: np.ndarray, salience: np.ndarray, *, layer_safety: bool = True) -> Selection:
    """Keep the most salient head of each cluster, then the most salient head of any empty layer.

    Parameters
    ----------
    labels : ndarray of shape (N,)
        Cluster id of head ``n = l * H + h``.
    salience : ndarray of shape (L, H)
        Normalised salience; ties go to the lower global index.
    layer_safety : bool
        Apply the paper's layer-safety rule.

    Returns
    -------
    Selection
    """
    grid = _as_grid(salience)
    flat = grid.reshape(-1)
    labels = np.asarray(labels)
    if labels.shape != flat.shape:
        raise ValueError(f"labels must have one entry per head ({flat.size}), got {labels.shape}")
    n_heads = grid.shape[1]
    mask = np.zeros(grid.shape, dtype=bool)
    reps: list[Head] = []
    for cluster_id in np.unique(labels):
        members = np.flatnonzero(labels == cluster_id)
        best = int(members[np.argmax(flat[members])])
        reps.append((best // n_heads, best % n_heads))
        mask[best // n_heads, best % n_heads] = True
    added = _layer_safety(mask, grid) if layer_safety else ()
    return Selection(kept_mask=mask, representatives=tuple(sorted(reps)), layer_safety_added=added, strategy="cahp")


def select_most_frequent(frequency: np.ndarray, salience: np.ndarray, count: int) -> Selection:
    """Keep the ``count`` heads chosen most often, then the most salient head of any empty layer.

    Parameters
    ----------
    frequency : ndarray of shape (L, H)
        How often each head was chosen (a share or a count).
    salience : ndarray of shape (L, H)
        Breaks ties in ``frequency`` (more salient first, then the lower global index).
    count : int
        1 <= count <= L * H.

    Returns
    -------
    Selection
        The ``count`` heads as ``representatives``; ``strategy`` ``stability-selection``.

    References
    ----------
    Meinshausen & Buehlmann (2010), stability selection, with the number kept fixed instead of a
    frequency threshold.
    """
    grid = _as_grid(salience)
    votes = np.asarray(frequency, dtype=np.float64)
    if votes.shape != grid.shape:
        raise ValueError(f"frequency must have the shape of salience {grid.shape}, got {votes.shape}")
    _check_count(count, grid.size)
    # lexsort sorts by its last key first: frequency, then salience, then the index (stable).
    order = np.lexsort((-grid.reshape(-1), -votes.reshape(-1)))[:count]
    chosen = _from_indices(order, grid.shape, "stability-selection")
    mask = chosen.kept_mask.copy()
    added = _layer_safety(mask, grid)
    return Selection(kept_mask=mask, representatives=chosen.representatives, layer_safety_added=added,
                     strategy=chosen.strategy)


def select_top_salience(salience: np.ndarray, count: int) -> Selection:
    """Baseline: the ``count`` globally most salient heads (Michel et al., 2019 style).

    No layer-safety rule: the baselines keep exactly ``count`` heads, and a layer left without
    heads still runs after surgery.
    """
    grid = _as_grid(salience)
    _check_count(count, grid.size)
    order = np.argsort(-grid.reshape(-1), kind="stable")[:count]
    return _from_indices(order, grid.shape, "salience")


def select_random(shape: tuple[int, int], count: int, *, seed: int) -> Selection:
    """Baseline: ``count`` heads drawn uniformly at random with ``seed``."""
    size = shape[0] * shape[1]
    _check_count(count, size)
    order = np.random.default_rng(seed).choice(size, size=count, replace=False)
    return _from_indices(order, shape, "random")


def _check_count(count: int, size: int) -> None:
    if not 1 <= count <= size:
        raise ConfigError(f"the number of heads to keep must be between 1 and {size}, got {count}")


def _from_indices(indices: np.ndarray, shape: tuple[int, int], strategy: str) -> Selection:
    mask = np.zeros(shape, dtype=bool)
    mask.reshape(-1)[indices] = True
    reps = tuple(sorted((int(i) // shape[1], int(i) % shape[1]) for i in indices))
    return Selection(kept_mask=mask, representatives=reps, layer_safety_added=(), strategy=strategy)
