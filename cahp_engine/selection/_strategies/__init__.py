"""Head-selection strategies: a table of names, each served by one small module.

A strategy turns a :class:`~cahp_engine.selection.HeadAnalysis` into the heads to keep. ``cahp`` keeps
the most salient head of each of the ``k`` clusters (plus layer safety); the baselines keep ``count``
heads by another rule; the consensus strategies (``coassociation``, ``stability-selection``,
``mean-distance``) make CAHP's choice steadier by combining the analysis with its leave-one-shard-out
analyses (:mod:`cahp_engine.selection._consensus`). Adding a baseline is one module defining
``choose(analysis, k, *, count, seed) -> Selection`` and one entry in
:data:`~cahp_engine._strategy_names.STRATEGY_MODULES`; ``PruningConfig.strategy``, ``cahp prune --strategy`` and the
job API take their choices from it.

This package is importable without torch or numpy (the configuration validates names against it);
a strategy's module is imported when it is first used.

References
----------
Paper Algorithm 1 lines 10-11 (CAHP).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Protocol, cast

from cahp_engine._strategy_names import STRATEGIES, STRATEGY_MODULES
from cahp_engine.errors import ConfigError

if TYPE_CHECKING:
    from cahp_engine.selection._analysis import HeadAnalysis
    from cahp_engine.selection._choice import Selection



class Strategy(Protocol):
    """``choose(analysis, k, *, count, seed) -> Selection``.

    ``k`` is the number of clusters (CAHP's k*); ``count`` the number of heads a baseline keeps
    (CAHP's own count at ``k`` unless the caller fixed one); ``seed`` seeds any random choice.
    """

    def __call__(self, analysis: HeadAnalysis, k: int, *, count: int, seed: int) -> Selection: ...


def get_strategy(name: str) -> Strategy:
    """The ``choose`` function of the strategy ``name`` (its module in ``STRATEGY_MODULES``)."""
    if name not in STRATEGY_MODULES:
        raise ConfigError(f"`strategy` must be one of {', '.join(STRATEGIES)}, got {name!r}")
    return cast(Strategy, importlib.import_module(STRATEGY_MODULES[name]).choose)


def choose(analysis: HeadAnalysis, k: int, strategy: str = "cahp", *, count: int | None = None,
           seed: int = 0) -> Selection:
    """Choose the heads to keep from ``analysis`` with ``strategy``.

    Parameters
    ----------
    analysis : HeadAnalysis
        Curve, partitions and head importance of one model (:func:`~cahp_engine.selection.analyze_heads`).
    k : int
        Number of clusters, 1 <= k <= N - 1 for N heads: a knee of ``analysis`` or a fixed count.
    strategy : str
        A name in :data:`STRATEGY_MODULES`.
    count : int, optional
        Heads a baseline keeps; default CAHP's count at ``k`` (k representatives plus layer safety),
        so every strategy keeps as many heads. CAHP and the consensus strategies ignore it (they keep
        k heads plus layer safety).
    seed : int
        Seeds the random baseline and the consensus strategies' FasterPAM.

    Returns
    -------
    Selection
    """
    chooser = get_strategy(strategy)
    if count is None:
        count = get_strategy("cahp")(analysis, k, count=0, seed=seed).num_kept
    return chooser(analysis, k, count=count, seed=seed)
