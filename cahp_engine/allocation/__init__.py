"""Pruning to a cost target: heads and feed-forward neurons allocated per layer by importance per unit cost.

Reading order: ``_importance`` (Fisher or Taylor scores of every head and neuron, one calibration pass)
-> ``_runtimes`` (PyTorch, onnxruntime fp32 and int8: what a latency is timed on) -> ``_costs`` (what a
layer costs: FLOPs, and a latency table measured once per machine and cached) -> ``_allocate`` (how many
heads and neurons each layer keeps to meet a target at the least predicted loss) -> ``_target``
(``prune_to_target``: the three, the surgery, and the measured speed-up).

The public names are declared in ``__init__.pyi`` and loaded on first use (SPEC 1 lazy loading), so
importing one name does not import the whole room."""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
