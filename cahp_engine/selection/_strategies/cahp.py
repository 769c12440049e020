"""CAHP: the most salient head of each of the k clusters, then one head for any layer left empty.

References
----------
Paper Algorithm 1 lines 10-11 and Section III-D (salience-led representatives, layer safety).
"""

from __future__ import annotations

from cahp_engine.selection._analysis import HeadAnalysis
from cahp_engine.selection._choice import Selection, select_representatives


def choose(analysis: HeadAnalysis, k: int, *, count: int, seed: int) -> Selection:
    """Representatives of the partition into ``k`` clusters; ``count`` and ``seed`` are not used."""
    return select_representatives(analysis.labels(k), analysis.salience)
