"""Baseline: the ``count`` globally most salient heads (Michel et al., 2019 style)."""

from __future__ import annotations

from cahp_engine.selection._analysis import HeadAnalysis
from cahp_engine.selection._choice import Selection, select_top_salience


def choose(analysis: HeadAnalysis, k: int, *, count: int, seed: int) -> Selection:
    """Top-``count`` heads by normalised salience; ``k`` and ``seed`` are not used."""
    return select_top_salience(analysis.salience, count)
