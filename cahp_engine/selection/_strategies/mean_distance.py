"""Consensus: FasterPAM on the graph-space distances averaged over the K + 1 t-SNE layouts, then
CAHP's rule.

A steadier graph space at no extra t-SNE run: each layout's distances are scaled to a mean of one
and averaged (see :func:`~cahp_engine.selection._consensus.mean_graph_distance`).

References
----------
Paper Section III-C (graph space) and Algorithm 1 lines 5-11. See :mod:`cahp_engine.selection._consensus`.
"""

from __future__ import annotations

from cahp_engine.selection._analysis import HeadAnalysis
from cahp_engine.selection._choice import Selection
from cahp_engine.selection._consensus import consensus_choice, mean_graph_distance, medoid_representatives


def _rule(analysis: HeadAnalysis, runs: tuple[HeadAnalysis, ...], k: int, choices: tuple[Selection, ...],
          seed: int) -> Selection:
    return medoid_representatives(mean_graph_distance(runs), k, analysis.salience, seed=seed)


def choose(analysis: HeadAnalysis, k: int, *, count: int, seed: int) -> Selection:
    """The most salient head of each of ``k`` clusters of the mean distances, plus layer safety;
    ``count`` is not used."""
    return consensus_choice(analysis, k, method="mean-distance", seed=seed, rule=_rule)
