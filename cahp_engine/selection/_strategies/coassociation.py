"""Consensus: FasterPAM on one minus the co-association of the K + 1 partitions at k, then CAHP's rule.

References
----------
Strehl & Ghosh (2002), cluster ensembles; paper Algorithm 1 lines 10-11 for the rule on the consensus
clusters. See :mod:`cahp_engine.selection._consensus`.
"""

from __future__ import annotations

from cahp_engine.selection._analysis import HeadAnalysis
from cahp_engine.selection._choice import Selection
from cahp_engine.selection._consensus import co_association, consensus_choice, medoid_representatives


def _rule(analysis: HeadAnalysis, runs: tuple[HeadAnalysis, ...], k: int, choices: tuple[Selection, ...],
          seed: int) -> Selection:
    return medoid_representatives(1.0 - co_association(runs, k), k, analysis.salience, seed=seed)


def choose(analysis: HeadAnalysis, k: int, *, count: int, seed: int) -> Selection:
    """The most salient head of each of ``k`` consensus clusters, plus layer safety; ``count`` is not used."""
    return consensus_choice(analysis, k, method="coassociation", seed=seed, rule=_rule)
