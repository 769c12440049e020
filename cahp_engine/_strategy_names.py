"""The names of the head-selection strategies and the module that implements each: data only.

Kept apart from the strategies themselves so that :class:`~cahp_engine.config.PruningConfig`, the job
API and ``cahp prune --strategy`` can list the choices without importing torch, numpy or the analysis.
"""

from __future__ import annotations

#: Strategy name -> the module whose ``choose`` implements it.
STRATEGY_MODULES: dict[str, str] = {
    "cahp": "cahp_engine.selection._strategies.cahp",
    "salience": "cahp_engine.selection._strategies.salience",
    "random": "cahp_engine.selection._strategies.random",
    "coassociation": "cahp_engine.selection._strategies.coassociation",
    "stability-selection": "cahp_engine.selection._strategies.stability_selection",
    "mean-distance": "cahp_engine.selection._strategies.mean_distance",
    "cahp-layer-salience": "cahp_engine.selection._strategies.cahp_layer_salience",
}
#: The strategy names, in the table's order (``cahp`` first).
STRATEGIES: tuple[str, ...] = tuple(STRATEGY_MODULES)
#: The strategies that combine CAHP's K + 1 analyses of one selection (the full one and the
#: leave-one-shard-out ones; :mod:`cahp_engine.selection._consensus`).
CONSENSUS_STRATEGIES: tuple[str, ...] = ("coassociation", "stability-selection", "mean-distance")
