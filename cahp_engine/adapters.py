"""Where each supported model family keeps its attention heads, and how to gate them.

One small :class:`ModelAdapter` per family names the modules; the functions below (gating, eager
switching) work on any adapter. Adding a family means adding one entry to ``_ADAPTERS`` and one
parametrised test case.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from cahp_engine.errors import PipelineError, UnsupportedModelError


@dataclass(frozen=True)
class AttentionParts:
    """The modules of one layer's multi-head attention.

    ``module`` holds the head count attributes; ``output`` is the projection whose input is the
    concatenation of the heads' outputs, shape (B, T, H * d).
    """

    module: nn.Module
    query: nn.Linear
    key: nn.Linear
    value: nn.Linear
    output: nn.Linear


@dataclass(frozen=True)
class ModelAdapter:
    """Module paths of one family of ``*ForSequenceClassification`` models."""

    family: str
    model_types: tuple[str, ...]
    base_model_attr: str
    layers_path: str
    attention_path: str
    qkv_names: tuple[str, str, str]
    output_path: str
    heads_attr: str
    config_heads_attr: str
    config_layers_attr: str
    config_hidden_attr: str
    all_head_size_attr: str | None = None

    def layers(self, model: nn.Module) -> list[nn.Module]:
        """The encoder layers, in order."""
        return list(_get(_get(model, self.base_model_attr), self.layers_path))

    def attention(self, layer: nn.Module) -> AttentionParts:
        """The attention modules of ``layer``."""
        module = _get(layer, self.attention_path)
        q, k, v = (getattr(module, name) for name in self.qkv_names)
        return AttentionParts(module=module, query=q, key=k, value=v, output=_get(layer, self.output_path))

    def num_layers(self, config: Any) -> int:
        return int(getattr(config, self.config_layers_attr))

    def num_heads(self, config: Any) -> int:
        """Heads per layer of the unpruned architecture."""
        return int(getattr(config, self.config_heads_attr))

    def head_dim(self, config: Any) -> int:
        return int(getattr(config, self.config_hidden_attr)) // self.num_heads(config)

    def set_head_count(self, parts: AttentionParts, heads: int, head_dim: int) -> None:
        """Record a new head count on the attention module after its projections were sliced."""
        setattr(parts.module, self.heads_attr, heads)
        if self.all_head_size_attr is not None:
            setattr(parts.module, self.all_head_size_attr, heads * head_dim)


def _get(obj: Any, dotted: str) -> Any:
    for name in dotted.split("."):
        obj = getattr(obj, name)
    return obj


def _bert_like(family: str, model_types: tuple[str, ...], base: str) -> ModelAdapter:
    return ModelAdapter(
        family=family,
        model_types=model_types,
        base_model_attr=base,
        layers_path="encoder.layer",
        attention_path="attention.self",
        qkv_names=("query", "key", "value"),
        output_path="attention.output.dense",
        heads_attr="num_attention_heads",
        all_head_size_attr="all_head_size",
        config_heads_attr="num_attention_heads",
        config_layers_attr="num_hidden_layers",
        config_hidden_attr="hidden_size",
    )


_ADAPTERS: dict[str, ModelAdapter] = {
    a.family: a
    for a in (
        _bert_like("bert", ("bert",), "bert"),
        _bert_like("roberta", ("roberta",), "roberta"),
        _bert_like("xlm-roberta", ("xlm-roberta",), "roberta"),
        _bert_like("electra", ("electra",), "electra"),
        ModelAdapter(
            family="distilbert",
            model_types=("distilbert",),
            base_model_attr="distilbert",
            layers_path="transformer.layer",
            attention_path="attention",
            qkv_names=("q_lin", "k_lin", "v_lin"),
            output_path="attention.out_lin",
            heads_attr="n_heads",
            config_heads_attr="n_heads",
            config_layers_attr="n_layers",
            config_hidden_attr="dim",
        ),
    )
}

SUPPORTED_FAMILIES: tuple[str, ...] = tuple(_ADAPTERS)


def get_adapter(model_or_config: Any) -> ModelAdapter:
    """Return the adapter for a model or its config.

    Raises
    ------
    UnsupportedModelError
        If the model type has no adapter; the message names the supported families.
    """
    config = getattr(model_or_config, "config", model_or_config)
    model_type = getattr(config, "model_type", None)
    for adapter in _ADAPTERS.values():
        if model_type in adapter.model_types:
            return adapter
    raise UnsupportedModelError(
        f"model type {model_type!r} is not supported; CAHP supports sequence classifiers of the "
        f"families {', '.join(SUPPORTED_FAMILIES)}"
    )


def heads_per_layer(model: nn.Module) -> list[int]:
    """Current head count of every layer (after any pruning)."""
    adapter = get_adapter(model)
    d = adapter.head_dim(model.config)
    return [adapter.attention(layer).query.out_features // d for layer in adapter.layers(model)]


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
    the heads' outputs concatenated, shape (B, T, H_l * d). This is the transformers 5 replacement
    of the removed ``head_mask`` argument, which is now ignored silently.
    """
    adapter = get_adapter(model)
    d = adapter.head_dim(model.config)
    layers = adapter.layers(model)
    if len(gates) != len(layers):
        raise ValueError(f"expected {len(layers)} gate vectors, one per layer, got {len(gates)}")
    handles = []

    def make_hook(gate: torch.Tensor) -> Callable[..., tuple[torch.Tensor, ...]]:
        def hook(_module: nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
            x = args[0]
            shaped = x.view(*x.shape[:-1], -1, d) * gate.to(x.dtype).view(-1, 1)
            return (shaped.view(x.shape), *args[1:])

        return hook

    try:
        for layer, gate in zip(layers, gates, strict=True):
            handles.append(adapter.attention(layer).output.register_forward_pre_hook(make_hook(gate)))
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def eager_attention(model: nn.Module) -> Iterator[None]:
    """Switch the model to the eager attention implementation and restore the previous one after.

    Only eager attention returns attention probabilities in transformers 5; sdpa and flash return
    nothing for ``output_attentions=True``.
    """
    previous = getattr(model.config, "_attn_implementation", None)
    setter = getattr(model, "set_attn_implementation", None)
    if setter is None:
        raise PipelineError("this transformers version has no set_attn_implementation; install transformers>=5")
    setter("eager")
    try:
        yield
    finally:
        if previous is not None and previous != "eager":
            setter(previous)
