"""Baseline: ``count`` heads drawn uniformly at random."""

from __future__ import annotations

from cahp_engine.selection._analysis import HeadAnalysis
from cahp_engine.selection._choice import Selection, select_random


def choose(analysis: HeadAnalysis, k: int, *, count: int, seed: int) -> Selection:
    """``count`` heads drawn with ``seed``; ``k`` is not used."""
    return select_random(analysis.shape, count, seed=seed)
