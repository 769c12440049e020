"""Where each supported model family keeps its attention heads, and how to gate them.

One small :class:`ModelAdapter` per family names the modules (:mod:`cahp_engine.models._families`, which
needs no torch); the functions here (gating, eager switching, the attention an ONNX export traces) work
on any adapter. Adding a family means adding one entry to ``_ADAPTERS`` there and one parametrised
test case.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from cahp_engine.errors import PipelineError
from cahp_engine.models._families import (
    SUPPORTED_FAMILIES,
    SUPPORTED_MODEL_TYPES,
    AttentionParts,
    ModelAdapter,
    get_adapter,
)

__all__ = ["SUPPORTED_FAMILIES", "SUPPORTED_MODEL_TYPES", "AttentionParts", "ModelAdapter", "eager_attention",
           "export_attention", "gate_heads", "get_adapter", "heads_per_layer"]


def heads_per_layer(model: nn.Module) -> list[int]:
    """Current head count of every layer (after any pruning)."""
    adapter = get_adapter(model)
    d = adapter.head_dim(model.config)
    return [adapter.attention(layer).output.in_features // d for layer in adapter.layers(model)]


@contextlib.contextmanager
def gate_heads(model: nn.Module, gates: Sequence[torch.Tensor]) -> Iterator[None]:
    """Multiply each head's output by a gate while the context is open.

    Parameters
    ----------
    model : a supported ``*ForSequenceClassification`` model
    gates : sequence of L tensors, gate ``l`` of shape (H_l,)
        ``H_l`` is the current head count of layer ``l``. Gradients flow to the gates.

    Notes
    -----
    The gate is applied by a forward pre-hook on the attention output projection, whose input is
    the heads' outputs concatenated, shape (B, T, H_l * d), in every family (BERT's
    ``attention.output.dense``, DeBERTa's ``attention.output.dense``, ModernBERT's ``attn.Wo``).
    This is the transformers 5 replacement of the removed ``head_mask`` argument, which is now
    ignored silently.
    """
    adapter = get_adapter(model)
    d = adapter.head_dim(model.config)

    def gated(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return (x.view(*x.shape[:-1], -1, d) * gate.to(x.dtype).view(-1, 1)).view(x.shape)

    with scaled_inputs([adapter.attention(layer).output for layer in adapter.layers(model)], gates, gated):
        yield


@contextlib.contextmanager
def scaled_inputs(projections: Sequence[nn.Module], gates: Sequence[torch.Tensor],
                  scale: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Iterator[None]:
    """While the context is open, each layer's projection reads ``scale(x, gate)`` instead of its input ``x``.

    One forward pre-hook per projection (``projections[l]`` takes ``gates[l]``), removed on exit;
    :func:`gate_heads` and :func:`~cahp_engine.models.gate_neurons` are this over two kinds of projection.
    """
    if len(gates) != len(projections):
        raise ValueError(f"expected {len(projections)} gate vectors, one per layer, got {len(gates)}")

    def make_hook(gate: torch.Tensor) -> Callable[..., tuple[torch.Tensor, ...]]:
        def hook(_module: nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
            return (scale(args[0], gate), *args[1:])

        return hook

    handles = []
    try:
        for projection, gate in zip(projections, gates, strict=True):
            handles.append(projection.register_forward_pre_hook(make_hook(gate)))
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def eager_attention(model: nn.Module) -> Iterator[None]:
    """Make every attention module return its probabilities while the context is open.

    Switches the model to the eager attention implementation and restores the previous one after:
    only eager attention returns attention probabilities in transformers 5; sdpa and flash return
    nothing for ``output_attentions=True``. For a family whose attention module returns them only
    when asked (DeBERTa's ``output_attentions`` argument, see ``ModelAdapter.probs_flag``), a
    forward pre-hook sets that argument on each attention module; the layers above still drop the
    maps unless the caller asked for them, so the model's outputs do not change.
    """
    previous = getattr(model.config, "_attn_implementation", None)
    setter = getattr(model, "set_attn_implementation", None)
    if setter is None:
        raise PipelineError("this transformers version has no set_attn_implementation; install transformers>=5")
    adapter = get_adapter(model)
    setter("eager")
    handles = []
    try:
        if adapter.probs_flag is not None:
            hook = functools.partial(_set_flag, flag=adapter.probs_flag)
            for layer in adapter.layers(model):
                module = adapter.attention(layer).module
                handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
        yield
    finally:
        for handle in handles:
            handle.remove()
        if previous is not None and previous != "eager":
            setter(previous)


def _set_flag(
    module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], *, flag: str
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Forward pre-hook: call ``module`` with argument ``flag`` set to True, however it was passed."""
    # Bound against the class's forward: a head-less module's instance forward takes *args.
    bound = inspect.signature(type(module).forward).bind(module, *args, **kwargs)
    bound.arguments[flag] = True
    return bound.args[1:], bound.kwargs


#: The attention implementation :func:`export_attention` registers with transformers.
EXPORT_ATTENTION = "cahp_export_sdpa"


def _sdpa_without_empty_rows(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """transformers' sdpa attention, with an explicit zero for a query that may attend to no key.

    PyTorch's ``scaled_dot_product_attention`` returns zeros for such a row; the ONNX exporter's
    translation of it, with a boolean mask, spreads the row evenly over every key instead. The row
    exists only under a sliding window, for a padding position whose whole window is padding.
    ``attention_mask`` is boolean, shape (B, 1, T_q, T_k); the output is (B, T_q, H, d).
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    output, weights = sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        attends = attention_mask.any(dim=-1).any(dim=1)
        output = output * attends[:, :, None, None].to(output.dtype)
    return output, weights


@contextlib.contextmanager
def export_attention(model: nn.Module) -> Iterator[None]:
    """Give ``model`` an attention the ONNX exporter translates exactly, while the context is open.

    Only a model with sliding-window layers (ModernBERT's local attention) that runs transformers'
    sdpa attention changes: a padding position whose window holds only padding attends to no key,
    and PyTorch answers that row with zeros while the exported graph would average every key. The
    position matters wherever the classifier reads it: ModernBERT's ``classifier_pooling="cls"``
    reads position 0, padding under left padding. Inside the context the model runs sdpa with that
    row set to zero explicitly (the same numbers in PyTorch), so the traced graph keeps it; the
    previous implementation is restored on exit. Other models are left as they are.
    """
    config: Any = model.config
    sliding = "sliding_attention" in (getattr(config, "layer_types", None) or ())
    if not sliding or getattr(config, "_attn_implementation", None) != "sdpa":
        yield
        return
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(EXPORT_ATTENTION, _sdpa_without_empty_rows)
    AttentionMaskInterface.register(EXPORT_ATTENTION, sdpa_mask)
    model.set_attn_implementation(EXPORT_ATTENTION)  # type: ignore[operator]
    try:
        yield
    finally:
        model.set_attn_implementation("sdpa")  # type: ignore[operator]
