"""CAHP: Complementary Attention Head Pruning for Transformer encoder classifiers.

The engine is a set of rooms, one per part of a run, each publishing its names from its
``__init__``: :mod:`cahp_engine.data` (datasets, tokenisation), :mod:`cahp_engine.models` (family
adapters, loading, surgery, checkpoints), :mod:`cahp_engine.selection` (CAHP's analysis and the
strategies), :mod:`cahp_engine.recovery` (fine-tuning, distillation, evaluation),
:mod:`cahp_engine.export` (ONNX, int8, model cards) and :mod:`cahp_engine.run` (a whole run, the
budget, the report). :mod:`cahp_engine.config`, :mod:`cahp_engine.errors`, :mod:`cahp_engine.results`
(what every record is made of; each room keeps its own records) and :mod:`cahp_engine.progress` are the
vocabulary they share. docs/architecture.md draws them.

The names a user starts with are re-exported here (declared in ``__init__.pyi``); like every room,
the package loads a name's module on first use, so ``import cahp_engine`` stays cheap.
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
