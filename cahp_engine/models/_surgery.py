"""Physical removal of attention heads, and the record that lets a pruned model be rebuilt.

Removing head ``h`` of a layer deletes rows ``h*d : (h+1)*d`` of the query, key and value projections
(weights and biases; in each of the three blocks of a fused q/k/v projection, and in DeBERTa's
relative-position projections when it has separate ones) and the same columns of the output
projection, so the layer computes exactly what the unpruned layer computes with that head's gate at
zero. transformers 5 dropped its own ``prune_heads``; this module is the replacement, written once
over :mod:`cahp_engine.models._adapters`.

The result is recorded on the config as ``config.cahp`` (see :func:`pruning_record`), so that
``save_pretrained`` writes it into ``config.json`` and :mod:`cahp_engine.models._checkpoint` can rebuild the
sliced architecture before loading weights.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from cahp_engine._torch import num_parameters
from cahp_engine.errors import ModelLoadError
from cahp_engine.models._adapters import AttentionParts, ModelAdapter, get_adapter
from cahp_engine.models._kept import HEADS, changed_layers, current_kept, parse_kept, plan_kept

RECORD_ATTR = "cahp"
RECORD_FORMAT_VERSION = 1
#: The record's version once it also keeps feed-forward neurons: a cahp that reads only version 1 says to
#: upgrade instead of failing on the narrower projections. A heads-only record stays version 1.
NEURONS_FORMAT_VERSION = 2


@dataclass(frozen=True)
class SurgeryResult:
    """What :func:`prune_heads` left in the model.

    Attributes
    ----------
    kept : tuple of L tuples of int
        ``kept[l]`` are the heads layer ``l`` still has, as indices of the ORIGINAL (never pruned)
        architecture, ascending. An empty tuple means the layer has no heads left.
    heads_before, heads_after : int
        Total heads over all layers before and after this call.
    params_before, params_after : int
        Parameter counts (shared tensors counted once) before and after this call.
    """

    kept: tuple[tuple[int, ...], ...]
    heads_before: int
    heads_after: int
    params_before: int
    params_after: int


def prune_heads(model: nn.Module, kept: Mapping[int, Sequence[int]]) -> SurgeryResult:
    """Remove every attention head not listed in ``kept``, in place.

    Parameters
    ----------
    model : a supported ``*ForSequenceClassification`` model, pruned before or not
    kept : mapping of layer index -> original head indices to keep
        Indices refer to the original architecture even when ``model`` was pruned before. Layers
        missing from the mapping keep all the heads they have now. An empty sequence removes every
        head of that layer; the layer then adds only its output projection's bias.

    Returns
    -------
    SurgeryResult

    Raises
    ------
    InvalidInputError
        If a layer or head index is out of range, repeated, or names a head an earlier pruning
        already removed. Nothing is changed in that case.

    Notes
    -----
    Parameters are replaced, not resized, so build any optimizer after pruning.

    References
    ----------
    CAHP paper, Section III-D (removing the complementary set H \\ H*) and Section IV-B.5.
    """
    adapter = get_adapter(model)
    config = model.config
    head_dim = adapter.head_dim(config)
    layers = adapter.layers(model)
    current = current_kept_heads(model)
    plan = plan_kept(HEADS, kept, current, adapter.num_heads(config))

    heads_before = sum(len(heads) for heads in current)
    params_before = num_parameters(model)
    for index, positions in changed_layers(current, plan):
        _slice_layer(adapter, adapter.attention(layers[index]), positions, head_dim)
    setattr(config, RECORD_ATTR, _record(adapter.num_heads(config), plan, previous=getattr(config, RECORD_ATTR, None)))
    return SurgeryResult(
        kept=tuple(plan),
        heads_before=heads_before,
        heads_after=sum(len(heads) for heads in plan),
        params_before=params_before,
        params_after=num_parameters(model),
    )


def current_kept_heads(model: nn.Module) -> list[tuple[int, ...]]:
    """The original indices of the heads each layer has now.

    An unpruned model gives ``range(H)`` for every layer.

    Raises
    ------
    PipelineError
        If the model's ``cahp`` record disagrees with its attention shapes, or a model without a
        record has fewer heads than its config says (it was pruned by something else).
    """
    adapter = get_adapter(model)
    head_dim = adapter.head_dim(model.config)
    shapes = [adapter.attention(layer).output.in_features // head_dim for layer in adapter.layers(model)]
    return current_kept(HEADS, pruning_record(model.config), shapes, adapter.num_heads(model.config))


def pruning_record(config: Any) -> dict[int, tuple[int, ...]] | None:
    """Read and check the ``cahp`` record of a config: layer -> kept original head indices.

    Returns None when the config carries no record (an unpruned model).

    Raises
    ------
    ModelLoadError
        If the record is malformed or was written by a newer format.
    """
    record = getattr(config, RECORD_ATTR, None)
    if record is None:
        return None
    where = "the `cahp` record in the model config"
    if not isinstance(record, Mapping):
        raise ModelLoadError(f"{where} must be a mapping, got {type(record).__name__}")
    version = record.get("format_version")
    if version not in (RECORD_FORMAT_VERSION, NEURONS_FORMAT_VERSION):
        raise ModelLoadError(
            f"{where} has format_version {version!r}; this cahp reads versions {RECORD_FORMAT_VERSION} and "
            f"{NEURONS_FORMAT_VERSION}, upgrade cahp to load it"
        )
    adapter = get_adapter(config)
    heads = adapter.num_heads(config)
    layers = adapter.num_layers(config)
    if record.get("num_heads") != heads:
        raise ModelLoadError(f"{where} says num_heads={record.get('num_heads')!r} but the config has {heads}")
    kept_heads = record.get("kept_heads")
    if not isinstance(kept_heads, Mapping):
        raise ModelLoadError(f"{where} needs a `kept_heads` mapping of layer -> head indices")
    return parse_kept(HEADS, where, kept_heads, layers=layers, total=heads)


def _record(
    num_heads: int, plan: Sequence[tuple[int, ...]], *, neurons: tuple[int, Sequence[tuple[int, ...]]] | None = None,
    previous: Any = None,
) -> dict[str, Any]:
    """The ``cahp`` record of ``plan`` (kept heads), with the neurons given or those of the ``previous`` record."""
    # JSON object keys are strings; the layer index is written as one so the record survives
    # config.json unchanged.
    record: dict[str, Any] = {
        "format_version": RECORD_FORMAT_VERSION,
        "num_heads": num_heads,
        "kept_heads": {str(layer): list(heads) for layer, heads in enumerate(plan)},
    }
    if neurons is not None:
        total, kept = neurons
        record.update(format_version=NEURONS_FORMAT_VERSION, num_neurons=total,
                      kept_neurons={str(layer): list(n) for layer, n in enumerate(kept)})
    elif isinstance(previous, Mapping) and previous.get("kept_neurons") is not None:
        record.update(format_version=NEURONS_FORMAT_VERSION, num_neurons=previous.get("num_neurons"),
                      kept_neurons=previous["kept_neurons"])
    return record


def _slice_layer(adapter: ModelAdapter, parts: AttentionParts, positions: list[int], head_dim: int) -> None:
    """Keep the heads at ``positions`` (current numbering) of one layer's attention."""
    device = parts.output.weight.device
    width = parts.output.in_features  # H * d, the current heads
    # Head p owns columns p*d .. p*d + d - 1, and those rows in every block of a fused projection. Built
    # as tensors on the model's device: on the meta device (a checkpoint being checked before it is
    # loaded) they cost nothing, however large the config says a head is.
    heads = torch.tensor(positions, dtype=torch.long, device=device)
    columns = (heads[:, None] * head_dim + torch.arange(head_dim, device=device)).reshape(-1)
    rows = (torch.arange(parts.blocks, device=device)[:, None] * width + columns).reshape(-1)
    for projection in parts.projections:
        _keep_features(projection, rows, dim=0)
    _keep_features(parts.output, columns, dim=1)
    adapter.set_head_count(parts, len(positions), head_dim)
    if not positions:
        _bypass_attention(adapter, parts)


@torch.no_grad()
def _keep_features(linear: nn.Linear, index: torch.Tensor, *, dim: int) -> None:
    """Keep output rows (``dim=0``) or input columns (``dim=1``) of ``linear``, in place.

    The module object stays (hooks and references to it survive); its parameters are replaced, in
    the same dtype and device, and with the same ``requires_grad``. ``prune_linear_layer`` would
    build a new float32 module and warn when it initialises a zero-size weight.
    """
    weight = linear.weight
    linear.weight = nn.Parameter(weight.index_select(dim, index).clone(), requires_grad=weight.requires_grad)
    if dim == 0:
        if linear.bias is not None:
            bias = linear.bias
            linear.bias = nn.Parameter(bias.index_select(0, index).clone(), requires_grad=bias.requires_grad)
        linear.out_features = int(index.numel())
    else:
        linear.in_features = int(index.numel())


def _bypass_attention(adapter: ModelAdapter, parts: AttentionParts) -> None:
    """Make a head-less attention module skip the attention kernel.

    The family's own forward does run with zero heads on CPU, but fused attention kernels (flash,
    cuDNN) reject zero-size inputs, so the module's forward is replaced on this instance by one that
    returns the empty head outputs directly. The module itself stays: its class still matches
    transformers' output recorders (``output_attentions`` keeps one entry per layer, of shape
    (B, 0, T, T)), its hooks survive, and the adapter still finds its (empty) projections.
    """
    prefix = adapter.attention_path + "."
    output_name = adapter.output_path[len(prefix) :] if adapter.output_path.startswith(prefix) else None
    parts.module.forward = functools.partial(_forward_without_heads, parts.module, output_name=output_name)


def _forward_without_heads(
    module: nn.Module, hidden_states: torch.Tensor, *args: Any, output_name: str | None, **kwargs: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward of an attention module with no heads: hidden_states (B, T, D) -> ((B, T, 0), (B, 0, T, T)).

    When the output projection belongs to the attention module (DistilBERT's ``out_lin``) it is
    applied, which yields its bias broadcast to (B, T, D), as the gated-to-zero layer would.
    """
    batch, length = hidden_states.shape[:2]
    heads = hidden_states.new_zeros(batch, length, 0)
    weights = hidden_states.new_zeros(batch, 0, length, length)
    if output_name is not None:
        heads = module.get_submodule(output_name)(heads)
    return heads, weights
