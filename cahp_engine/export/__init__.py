"""Deployable copies of a pruned classifier: ONNX checked against PyTorch, int8, runtimes, model cards.

Reading order: ``_records`` (what an export reports) -> ``_runtime`` (onnxruntime sessions) -> ``_onnx``
(``export_onnx`` and parity) -> ``_int8`` (``quantize_int8``) -> ``_card_facts``, ``_card_body`` and
``_model_card`` (the model cards) -> ``_from_checkpoint`` (``cahp export`` of a saved checkpoint).

The public names are declared in ``__init__.pyi`` and loaded on first use (SPEC 1 lazy loading), so
importing one name does not import the whole room."""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
