"""Physical removal of feed-forward neurons, and gating them for importance and for checks.

Neuron ``j`` of a layer is one unit of its intermediate activation: row ``j`` of the projection into
the intermediate size (row ``b*I + j`` of each of the ``b`` blocks of ModernBERT's gated ``Wi``) and
column ``j`` of the projection back. Removing it deletes that row and that column, so the layer computes
exactly what the unpruned layer computes with that neuron's gate at zero; layers may keep different
numbers of neurons. A layer left with none skips its feed-forward block: the two projections no longer
multiply anything, and the block adds only the output projection's bias before the family's own
residual and LayerNorm, which is what the gated-to-zero block adds (post-LN families still normalise,
pre-LN families add the bias to the residual stream).

What was kept is recorded in the same ``config.cahp`` record as the heads (``kept_neurons``), so that
:func:`cahp_engine.models.load_pruned` rebuilds the non-uniform layers before it loads the weights.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from cahp_engine._torch import num_parameters
from cahp_engine.errors import ModelLoadError
from cahp_engine.models._adapters import get_adapter, scaled_inputs
from cahp_engine.models._families import FeedForwardParts
from cahp_engine.models._kept import NEURONS, changed_layers, current_kept, parse_kept, plan_kept
from cahp_engine.models._surgery import NEURONS_FORMAT_VERSION, RECORD_ATTR, _keep_features, _record, current_kept_heads


@dataclass(frozen=True)
class NeuronSurgeryResult:
    """What :func:`prune_neurons` left in the model.

    Attributes
    ----------
    kept : tuple of L tuples of int
        ``kept[l]`` are the neurons layer ``l`` still has, as indices of the ORIGINAL architecture,
        ascending. An empty tuple means the layer's feed-forward block is skipped.
    neurons_before, neurons_after : int
        Total intermediate neurons over all layers before and after this call.
    params_before, params_after : int
        Parameter counts before and after this call.
    """

    kept: tuple[tuple[int, ...], ...]
    neurons_before: int
    neurons_after: int
    params_before: int
    params_after: int


def neurons_per_layer(model: nn.Module) -> list[int]:
    """Current intermediate size of every layer (after any pruning)."""
    adapter = get_adapter(model)
    return [adapter.feed_forward(layer).output.in_features for layer in adapter.layers(model)]


def prune_neurons(model: nn.Module, kept: Mapping[int, Sequence[int]]) -> NeuronSurgeryResult:
    """Remove every feed-forward neuron not listed in ``kept``, in place.

    Parameters
    ----------
    model : a supported ``*ForSequenceClassification`` model, pruned before or not
    kept : mapping of layer index -> original neuron indices to keep
        Indices refer to the original architecture even when ``model`` was pruned before. Layers
        missing from the mapping keep the neurons they have now. An empty sequence removes the
        layer's whole feed-forward block (it then adds only its output bias).

    Returns
    -------
    NeuronSurgeryResult

    Raises
    ------
    UnsupportedModelError
        If the family's feed-forward block cannot be pruned (before anything changes).
    InvalidInputError
        If a layer or neuron index is out of range, repeated, or names a neuron an earlier pruning
        already removed. Nothing is changed in that case.

    Notes
    -----
    Parameters are replaced, not resized, so build any optimizer after pruning.

    References
    ----------
    Kwon et al. 2022, "A Fast Post-Training Pruning Framework for Transformers", Section 3 (neurons
    as the feed-forward block's prunable units, removed by slicing the two projections).
    """
    adapter = get_adapter(model)
    config = model.config
    layers = adapter.layers(model)
    current = current_kept_neurons(model)
    heads = current_kept_heads(model)
    plan = plan_kept(NEURONS, kept, current, adapter.num_neurons(config))

    before = sum(len(n) for n in current)
    params_before = num_parameters(model)
    for index, positions in changed_layers(current, plan):
        _slice_feed_forward(adapter.feed_forward(layers[index]), positions)
    setattr(config, RECORD_ATTR, _record(adapter.num_heads(config), heads, neurons=(adapter.num_neurons(config), plan)))
    return NeuronSurgeryResult(
        kept=tuple(plan),
        neurons_before=before,
        neurons_after=sum(len(n) for n in plan),
        params_before=params_before,
        params_after=num_parameters(model),
    )


def current_kept_neurons(model: nn.Module) -> list[tuple[int, ...]]:
    """The original indices of the neurons each layer has now; ``range(I)`` per layer when never pruned.

    Raises
    ------
    PipelineError
        If the record disagrees with the projections' shapes, or a model without a neuron record has
        layers narrower than its config says.
    """
    adapter = get_adapter(model)
    shapes = neurons_per_layer(model)
    return current_kept(NEURONS, neuron_record(model.config), shapes, adapter.num_neurons(model.config))


def neuron_record(config: Any) -> dict[int, tuple[int, ...]] | None:
    """Read and check the neuron part of a config's ``cahp`` record: layer -> kept original neuron indices.

    Returns None when the config carries no record, or one of heads only.

    Raises
    ------
    ModelLoadError
        If the neuron record is malformed.
    """
    record = getattr(config, RECORD_ATTR, None)
    if not isinstance(record, Mapping) or record.get("kept_neurons") is None:
        return None
    where = "the `cahp` record in the model config"
    adapter = get_adapter(config)
    total = adapter.num_neurons(config)
    layers = adapter.num_layers(config)
    if record.get("format_version") != NEURONS_FORMAT_VERSION:
        raise ModelLoadError(f"{where} keeps neurons but has format_version {record.get('format_version')!r}; "
                             f"neuron records are version {NEURONS_FORMAT_VERSION}")
    if record.get("num_neurons") != total:
        raise ModelLoadError(f"{where} says num_neurons={record.get('num_neurons')!r} but the config has {total}")
    kept = record["kept_neurons"]
    if not isinstance(kept, Mapping):
        raise ModelLoadError(f"{where} needs a `kept_neurons` mapping of layer -> neuron indices")
    return parse_kept(NEURONS, where, kept, layers=layers, total=total)


@contextlib.contextmanager
def gate_neurons(model: nn.Module, gates: Sequence[torch.Tensor]) -> Iterator[None]:
    """Multiply each feed-forward neuron's activation by a gate while the context is open.

    Parameters
    ----------
    model : a supported ``*ForSequenceClassification`` model
    gates : sequence of L tensors, gate ``l`` of shape (I_l,)
        ``I_l`` is the current neuron count of layer ``l``. Gradients flow to the gates.

    Notes
    -----
    A forward pre-hook on the output projection scales its input, the activations, shape (B, T, I_l).
    A gate of zero computes exactly what removing the neuron computes.
    """
    adapter = get_adapter(model)
    outputs = [adapter.feed_forward(layer).output for layer in adapter.layers(model)]
    with scaled_inputs(outputs, gates, lambda x, gate: x * gate.to(x.dtype)):
        yield


def _slice_feed_forward(parts: FeedForwardParts, positions: list[int]) -> None:
    """Keep the neurons at ``positions`` (current numbering) of one layer's feed-forward block."""
    device = parts.output.weight.device
    width = parts.output.in_features
    columns = torch.tensor(positions, dtype=torch.long, device=device)
    rows = (torch.arange(parts.blocks, device=device)[:, None] * width + columns).reshape(-1)
    _keep_features(parts.input, rows, dim=0)
    _keep_features(parts.output, columns, dim=1)
    if not positions:
        parts.input.forward = functools.partial(_no_neurons_in, parts.input)  # type: ignore[method-assign]
        parts.output.forward = functools.partial(_no_neurons_out, parts.output)  # type: ignore[method-assign]


def _no_neurons_in(_linear: nn.Linear, hidden_states: torch.Tensor) -> torch.Tensor:
    """Forward of a projection into zero neurons: (B, T, D) -> (B, T, 0), no multiplication."""
    return hidden_states.narrow(-1, 0, 0)


def _no_neurons_out(linear: nn.Linear, activations: torch.Tensor) -> torch.Tensor:
    """Forward of a projection out of zero neurons: (B, T, 0) -> its bias broadcast to (B, T, D), or zeros."""
    shape = (*activations.shape[:-1], linear.out_features)
    if linear.bias is None:
        return activations.new_zeros(shape)
    return linear.bias.expand(shape)
