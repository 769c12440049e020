"""The classifier a run prunes: family adapters, loading, physical head removal and pruned checkpoints.

Reading order: ``_adapters`` (where each family keeps its heads) -> ``_loading`` (``load_classifier``)
-> ``_surgery`` (``prune_heads``) -> ``_checkpoint`` (``save_pruned`` / ``load_pruned``).

The public names are declared in ``__init__.pyi`` and loaded on first use (SPEC 1 lazy loading), so
importing one name does not import the whole room."""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
