"""How stable a selection is: the same choice made from the statistics of every shard but one.

The signature and calibration samples are accumulated in K disjoint stratified shards
(:class:`~cahp_engine.selection.ShardedSignatures`, :class:`~cahp_engine.selection._convergence.Calibration`);
:func:`~cahp_engine.selection.analyze_heads` reruns the cheap stages once per left-out shard, and
:func:`selection_stability` makes the run's choice on each of those analyses and compares the K head
sets. Unlike the Jaccard across seeds (with PCA-initialised exact t-SNE the embedding does not depend
on the seed, so that figure measures FasterPAM alone), this measures how much the kept heads depend on
which samples were drawn, at no extra forward pass.

References
----------
Efron's jackknife for leaving one part out.
"""

from __future__ import annotations

import itertools
import statistics
import time

import numpy as np

from cahp_engine.selection._analysis import HeadAnalysis
from cahp_engine.selection._choice import Selection
from cahp_engine.selection._records import StabilityRecord
from cahp_engine.selection._strategies import choose


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Jaccard similarity of two boolean masks (1.0 when both are empty)."""
    union = int((a | b).sum())
    return float((a & b).sum() / union) if union else 1.0


def selection_stability(
    analysis: HeadAnalysis,
    selection: Selection,
    *,
    strategy: str,
    poly_degree: int,
    heads_to_keep: int | None,
    seed: int,
) -> StabilityRecord | None:
    """The run's choice on each leave-one-shard-out analysis, compared with the others and with ``selection``.

    Parameters
    ----------
    analysis : HeadAnalysis
        With ``leave_one_out`` analyses (None is returned when it has none).
    selection : Selection
        The run's selection, from the whole sample.
    strategy, poly_degree, heads_to_keep, seed
        As the run chose: k* is each analysis's own knee at ``poly_degree``, or ``heads_to_keep``.

    Returns
    -------
    StabilityRecord or None
        ``seconds`` counts the cheap-stage reruns (the ``stability`` timing of the analysis) and the
        choices made here.
    """
    if not analysis.leave_one_out:
        return None
    began = time.perf_counter()
    n_heads = selection.kept_mask.size
    masks: list[np.ndarray] = []
    ks: list[int] = []
    for loo in analysis.leave_one_out:
        k = loo.knees[poly_degree].k if heads_to_keep is None else min(heads_to_keep, n_heads - 1)
        chosen = choose(loo, k, strategy, count=heads_to_keep, seed=seed)
        masks.append(chosen.kept_mask)
        ks.append(k)
    pairs = [jaccard(a, b) for a, b in itertools.combinations(masks, 2)]
    frequency = np.mean(np.stack(masks).astype(np.float64), axis=0)
    return StabilityRecord(
        shards=len(masks),
        mean_jaccard=statistics.fmean(pairs),
        min_jaccard=min(pairs),
        jaccard_to_selection=statistics.fmean(jaccard(m, selection.kept_mask) for m in masks),
        k_stars=tuple(ks),
        heads_kept=tuple(int(m.sum()) for m in masks),
        kept_frequency=tuple(tuple(float(v) for v in row) for row in frequency),
        seconds=analysis.timings.get("stability", 0.0) + time.perf_counter() - began,
    )
