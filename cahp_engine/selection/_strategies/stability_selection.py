"""Consensus: the k heads CAHP's K + 1 single-run choices took most often as a cluster's
representative, ties by salience, then layer safety.

References
----------
Meinshausen & Buehlmann (2010), stability selection. See :mod:`cahp_engine.selection._consensus`.
"""

from __future__ import annotations

from cahp_engine.selection._analysis import HeadAnalysis
from cahp_engine.selection._choice import Selection, select_most_frequent
from cahp_engine.selection._consensus import consensus_choice, kept_frequency, representative_masks


def _rule(analysis: HeadAnalysis, runs: tuple[HeadAnalysis, ...], k: int, choices: tuple[Selection, ...],
          seed: int) -> Selection:
    return select_most_frequent(kept_frequency(representative_masks(choices)), analysis.salience, k)


def choose(analysis: HeadAnalysis, k: int, *, count: int, seed: int) -> Selection:
    """The ``k`` heads most often a representative, plus layer safety; ``count`` and ``seed`` are not used."""
    return consensus_choice(analysis, k, method="stability-selection", seed=seed, rule=_rule)
