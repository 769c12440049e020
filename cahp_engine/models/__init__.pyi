"""The classifier a run prunes: family adapters, loading, physical head and neuron removal and pruned checkpoints.

Reading order: ``_families`` and ``_adapters`` (where each family keeps its heads) -> ``_loading`` (``load_classifier``)
-> ``_kept`` (the original units each layer keeps) -> ``_surgery`` (``prune_heads``) and ``_neurons``
-> ``_checkpoint`` (``save_pruned`` / ``load_pruned``)."""

from ._adapters import eager_attention, export_attention, gate_heads, heads_per_layer
from ._checkpoint import load_pruned, save_pruned
from ._families import SUPPORTED_FAMILIES, get_adapter
from ._limits import DEFAULT_MAX_MODEL_PARAMS, MAX_SAFETENSORS_HEADER_BYTES
from ._loading import LoadedClassifier, load_classifier
from ._model_files import MAX_HEADER_BYTES, ModelFiles, check_declarations, check_weight_files, safetensors_header
from ._neurons import (
    NeuronSurgeryResult,
    current_kept_neurons,
    gate_neurons,
    neuron_record,
    neurons_per_layer,
    prune_neurons,
)
from ._surgery import current_kept_heads, prune_heads, pruning_record

__all__ = [
    "DEFAULT_MAX_MODEL_PARAMS", "MAX_HEADER_BYTES", "MAX_SAFETENSORS_HEADER_BYTES",
    "SUPPORTED_FAMILIES", "check_declarations", "check_weight_files",
    "current_kept_heads", "current_kept_neurons", "gate_neurons", "neuron_record", "NeuronSurgeryResult",
    "neurons_per_layer", "prune_neurons", "eager_attention", "export_attention", "gate_heads", "get_adapter",
    "heads_per_layer",
    "load_classifier", "load_pruned", "LoadedClassifier", "ModelFiles", "prune_heads", "pruning_record",
    "safetensors_header", "save_pruned",
]
