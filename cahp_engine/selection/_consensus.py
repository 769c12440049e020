"""A choice made from the K + 1 analyses one selection already has: the full one and the K
leave-one-shard-out ones (:attr:`~cahp_engine.selection.HeadAnalysis.leave_one_out`).

One selection of CAHP is a draw: t-SNE followed by k-medoids at a knee is sensitive to small changes
of the distance matrix, and "the most salient head of each cluster" flips when a cluster boundary
moves by one head. The K + 1 analyses are K + 1 such draws from the same sample at no extra forward
pass; a consensus over them is steadier than any one of them. Every method here cuts every analysis
at the same ``k`` (the run's k*), so that the K + 1 partitions and choices are comparable, and keeps
the main analysis's salience (from every calibration row) to pick a cluster's representative:

* ``coassociation`` (:func:`co_association`): for each pair of heads, the share of the K + 1
  partitions into k clusters that put them together; FasterPAM on 1 - that share with k medoids,
  then CAHP's rule (the most salient head of each consensus cluster, layer safety);
* ``stability-selection`` (:func:`kept_frequency` of the representatives): the k heads that CAHP's
  choices took most often as a cluster's representative, ties by salience, then layer safety (so
  K + 1 identical runs give CAHP's own choice);
* ``mean-distance`` (:func:`mean_graph_distance`): the heads' graph-space distances averaged over
  the K + 1 t-SNE layouts (each scaled to a mean distance of one: t-SNE's scale is arbitrary, and
  distances, unlike coordinates, do not depend on its rotation or reflection); FasterPAM on the mean
  with k medoids, then CAHP's rule.

Without leave-one-out analyses (``stability_shards`` 0, or shards too thin) there is nothing to take
a consensus over and each method makes CAHP's single-run choice.

References
----------
A. Strehl and J. Ghosh, "Cluster ensembles: a knowledge reuse framework for combining multiple
partitions", JMLR 3 (2002) (co-association). N. Meinshausen and P. Buehlmann, "Stability selection",
JRSS B 72 (2010). A. Fred and A. K. Jain, "Combining multiple clusterings using evidence
accumulation", IEEE TPAMI 27 (2005).
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
import time
from collections.abc import Callable

import numpy as np
from scipy.spatial.distance import cdist

from cahp_engine.selection._analysis import HeadAnalysis
from cahp_engine.selection._choice import Selection, select_representatives
from cahp_engine.selection._records import ConsensusRecord
from cahp_engine.selection._stability import jaccard
from cahp_engine.selection._sweep import cluster

#: ``rule(analysis, runs, k, choices, seed) -> Selection``: the consensus choice from the runs and
#: CAHP's choice on each of them.
Rule = Callable[[HeadAnalysis, tuple[HeadAnalysis, ...], int, tuple[Selection, ...], int], Selection]


def consensus_runs(analysis: HeadAnalysis) -> tuple[HeadAnalysis, ...]:
    """The K + 1 runs a consensus combines.

    Parameters
    ----------
    analysis : HeadAnalysis

    Returns
    -------
    tuple of HeadAnalysis
        ``analysis`` itself, then its ``leave_one_out`` analyses (K of them, possibly none).
    """
    return (analysis, *analysis.leave_one_out)


def cahp_choices(runs: tuple[HeadAnalysis, ...], k: int) -> tuple[Selection, ...]:
    """CAHP's choice on each run at ``k`` clusters (each with its own salience)."""
    return tuple(select_representatives(run.labels(k), run.salience) for run in runs)


def kept_frequency(masks: np.ndarray) -> np.ndarray:
    """The share of the masks that hold each head.

    Parameters
    ----------
    masks : ndarray of shape (R, L, H), bool

    Returns
    -------
    ndarray of shape (L, H), float64
    """
    return np.asarray(masks, dtype=np.float64).mean(axis=0)


def representative_masks(choices: tuple[Selection, ...]) -> np.ndarray:
    """The representatives of each choice (its kept heads without the layer-safety ones), shape (R, L, H)."""
    masks = np.stack([choice.kept_mask for choice in choices])
    for mask, choice in zip(masks, choices, strict=True):
        for layer, head in choice.layer_safety_added:
            mask[layer, head] = False
    return masks


def co_association(runs: tuple[HeadAnalysis, ...], k: int) -> np.ndarray:
    """The share of the runs' partitions into ``k`` clusters that put heads i and j together.

    Returns
    -------
    ndarray of shape (N, N), float64
        Symmetric, ones on the diagonal.

    References
    ----------
    Strehl & Ghosh (2002), Section 3; Fred & Jain (2005), evidence accumulation.
    """
    labels = np.stack([run.labels(k) for run in runs])  # (R, N)
    return (labels[:, :, None] == labels[:, None, :]).mean(axis=0)


def mean_graph_distance(runs: tuple[HeadAnalysis, ...]) -> np.ndarray:
    """The runs' graph-space distances, each scaled to a mean off-diagonal distance of one, averaged.

    Returns
    -------
    ndarray of shape (N, N), float64
    """
    scaled = []
    for run in runs:
        distances = cdist(run.graph_space.points, run.graph_space.points)
        n = distances.shape[0]
        scale = distances.sum() / max(n * (n - 1), 1)
        scaled.append(distances / scale if scale > 0 else distances)
    return np.mean(scaled, axis=0)


def medoid_representatives(distances: np.ndarray, k: int, salience: np.ndarray, *, seed: int) -> Selection:
    """FasterPAM with ``k`` medoids on ``distances``, then CAHP's rule: the most salient head of each
    cluster and layer safety. ``k`` = 1 is one cluster of every head.

    Parameters
    ----------
    distances : ndarray of shape (N, N)
    k : int
        1 <= k <= N - 1.
    salience : ndarray of shape (L, H)
    seed : int
        FasterPAM's seed.
    """
    labels = cluster(distances, k, seed=seed).labels if k >= 2 else np.zeros(salience.size, dtype=np.int64)
    return select_representatives(labels, salience)


def consensus_choice(analysis: HeadAnalysis, k: int, *, method: str, seed: int, rule: Rule) -> Selection:
    """The consensus ``method`` (made by ``rule``) over the K + 1 runs of ``analysis`` at ``k`` clusters.

    Parameters
    ----------
    analysis : HeadAnalysis
        With ``leave_one_out`` analyses; without them CAHP's single-run choice is returned (its
        ``strategy`` is ``cahp`` and it has no ``consensus``).
    k : int
        Clusters, 1 <= k <= N - 1: the run's k*, for every run.
    method : str
        The strategy's name, recorded.
    seed : int
        Seeds FasterPAM where the rule clusters.
    rule : callable
        See :data:`Rule`.

    Returns
    -------
    Selection
        With ``strategy`` = ``method`` and ``consensus``: how the K + 1 runs agreed, how often each
        head was kept, what the consensus cost.
    """
    if not analysis.leave_one_out:
        return select_representatives(analysis.labels(k), analysis.salience)
    began = time.perf_counter()
    runs = consensus_runs(analysis)
    choices = cahp_choices(runs, k)
    chosen = rule(analysis, runs, k, choices, seed)
    kept = np.stack([choice.kept_mask for choice in choices])
    pairs = [jaccard(a, b) for a, b in itertools.combinations(kept, 2)]
    record = ConsensusRecord(
        method=method,
        runs=len(runs),
        k=k,
        mean_jaccard=statistics.fmean(pairs),
        min_jaccard=min(pairs),
        jaccard_to_single_run=jaccard(chosen.kept_mask, kept[0]),
        kept_frequency=tuple(tuple(float(v) for v in row) for row in kept_frequency(kept)),
        seconds=time.perf_counter() - began,
    )
    return dataclasses.replace(chosen, strategy=method, consensus=record)
