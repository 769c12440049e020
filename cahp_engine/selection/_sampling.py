"""The order in which selection reads training samples: seeded, stratified, split into shards.

Every prefix of a :class:`SampleOrder` is a stratified random sample of the training split (each
class within one sample of its share), so a pass that stops early has still seen the classes in
their proportions; and every sample belongs to one of K shards, each itself stratified, so that the
statistics of any K - 1 shards are those of a smaller, equally stratified sample.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SampleOrder:
    """Training rows in the order selection reads them.

    Attributes
    ----------
    rows : ndarray of shape (n,), int64
        Row indices; ``rows[:m]`` is a stratified random sample of m rows for every m.
    shard : ndarray of shape (n,), int64
        Shard (0..K-1) of ``rows[i]``: its rank within its class, modulo K.
    shards : int
        K.
    """

    rows: np.ndarray
    shard: np.ndarray
    shards: int

    def __len__(self) -> int:
        return int(self.rows.shape[0])


def stratified_order(labels: np.ndarray, *, seed: int, shards: int = 1) -> SampleOrder:
    """A seeded random order of all rows whose every prefix is stratified by class.

    Parameters
    ----------
    labels : ndarray of shape (n,), integers 0..C-1
    seed : int
    shards : int, default 1

    Returns
    -------
    SampleOrder

    Notes
    -----
    Each class is shuffled; its i-th member of n_c gets the position ``(i + u) / n_c`` with u drawn
    uniformly in [0, 1), and all rows are sorted by position. A prefix of m rows therefore holds
    ``m * n_c / n`` members of class c, give or take one, whatever m is.
    """
    labels = np.asarray(labels)
    n = labels.shape[0]
    rng = np.random.default_rng(seed)
    position = np.empty(n, dtype=np.float64)
    rank = np.empty(n, dtype=np.int64)
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        i = np.arange(members.size)
        position[members] = (i + rng.random(members.size)) / members.size
        rank[members] = i
    rows = np.argsort(position, kind="stable").astype(np.int64)
    return SampleOrder(rows=rows, shard=(rank[rows] % max(shards, 1)).astype(np.int64), shards=max(shards, 1))


def resolve_amount(amount: int | float | str, n: int) -> int | None:
    """How many rows an explicit amount asks for: a count, a fraction of ``n`` (1.0 is every row) or
    ``"all"``; None for ``"auto"`` (the stopping rule decides)."""
    if amount == "auto":
        return None
    if amount == "all":
        return n
    if isinstance(amount, float):
        return min(n, max(1, round(amount * n)))
    return min(n, int(amount))


def ladder_sizes(total: int, *, first: int, growth: float) -> list[int]:
    """Sample counts at which a stopping rule looks: ``first``, then x ``growth`` each time, ending at ``total``.

    Parameters
    ----------
    total : int
        The cap.
    first : int
        The first rung (clipped to ``total``).
    growth : float > 1
    """
    sizes = [min(first, total)]
    while sizes[-1] < total:
        sizes.append(min(total, max(sizes[-1] + 1, math.ceil(sizes[-1] * growth))))
    return sizes


def class_floor_size(labels: np.ndarray, order: SampleOrder, floor: int) -> int:
    """The shortest prefix of ``order`` holding ``min(floor, n_c)`` rows of every class c."""
    ordered = np.asarray(labels)[order.rows]
    need = 0
    for c in np.unique(ordered):
        positions = np.flatnonzero(ordered == c)
        need = max(need, int(positions[min(floor, positions.size) - 1]) + 1)
    return need
