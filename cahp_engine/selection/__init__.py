"""Choosing the heads to keep: CAHP's analysis of a model and the strategies that choose from it.

Reading order of one selection (``select_heads`` in ``_select_heads``): ``_sampling`` (sample order,
shards) -> ``_signatures`` (per-class attention statistics) -> ``_convergence`` (when to stop reading)
-> ``_separation`` (Jeffries-Matusita features) -> ``_graph_space`` (t-SNE) -> ``_sweep`` (FasterPAM
and MSS for every k) -> ``_knee`` (k*) -> ``_head_structure`` (those four stages in one call)
-> ``_salience`` (head importance) -> ``_analysis`` (``analyze_heads``) -> ``_strategies`` (``choose``,
by the names in ``_registry``) -> ``_choice`` (the ``Selection`` rules) -> ``_stability`` -> ``_consensus``
(the consensus strategies' shared parts).

The public names are declared in ``__init__.pyi`` and loaded on first use (SPEC 1 lazy loading), so
importing one name does not import the whole room."""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
