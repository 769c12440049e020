"""The supported model families: one small :class:`ModelAdapter` each, naming where a family keeps its heads.

The adapter table (``_ADAPTERS``) and :func:`get_adapter` need no torch, so the job service can tell at submit
whether a model's ``config.json`` names a supported family; what works on a model's modules (gating,
eager switching) is in :mod:`cahp_engine.models._adapters`. Adding a family means adding one entry to
``_ADAPTERS`` and one parametrised test case.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cahp_engine.errors import UnsupportedModelError

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True)
class AttentionParts:
    """The modules of one layer's multi-head attention.

    Attributes
    ----------
    module : the module that computes the heads; a forward hook on it sees ``(heads, probabilities)``
        and it holds the head count attributes, if the family keeps any
    projections : the linear layers whose output rows are per-head blocks: query, key and value, and
        DeBERTa's separate relative-position projections when the layer has them
    output : the projection whose input is the concatenation of the heads' outputs, shape (B, T, H * d)
    blocks : int
        Row groups of ``H * d`` stacked in each projection: 3 for ModernBERT's fused ``Wqkv``
        (q, k, v), 1 otherwise. Head ``h`` owns rows ``b*H*d + h*d : b*H*d + (h+1)*d`` of group ``b``.
    """

    module: nn.Module
    projections: tuple[nn.Linear, ...]
    output: nn.Linear
    blocks: int = 1


@dataclass(frozen=True)
class FeedForwardParts:
    """The two projections of one layer's feed-forward block.

    Attributes
    ----------
    input : the projection into the intermediate neurons, whose output rows are per-neuron
    output : the projection back to the hidden size, whose input columns are per-neuron, shape (B, T, I)
    blocks : int
        Row groups of ``I`` stacked in ``input``: 2 for ModernBERT's gated ``Wi`` (input, gate), 1
        otherwise. Neuron ``j`` owns row ``b*I + j`` of group ``b`` and column ``j`` of ``output``.
    """

    input: nn.Linear
    output: nn.Linear
    blocks: int = 1


@dataclass(frozen=True)
class ModelAdapter:
    """Module paths of one family of ``*ForSequenceClassification`` models.

    ``qkv_names`` are the per-head input projections of the attention module (one fused name when
    ``fused_qkv``); ``position_names`` are relative-position projections sliced like them when the
    module has them (DeBERTa with ``share_att_key=False``). ``heads_attr`` is None for a module
    that infers its head count from its weights (ModernBERT). ``probs_flag`` names a forward
    argument the attention module needs set to return its probabilities even under eager
    attention (DeBERTa's ``output_attentions``). ``pad_offset_positions`` marks RoBERTa-style
    position ids, which start after the padding index. ``ffn_input_path`` and ``ffn_output_path``
    name the feed-forward projections relative to a layer (None for a family whose feed-forward
    block cannot be cut neuron by neuron); ``ffn_blocks`` counts the row groups of the input one.
    """

    family: str
    model_types: tuple[str, ...]
    base_model_attr: str
    layers_path: str
    attention_path: str
    qkv_names: tuple[str, ...]
    output_path: str
    heads_attr: str | None
    #: The config's names for the head count, the layer count and the hidden size (transformers' usual ones).
    config_heads_attr: str = "num_attention_heads"
    config_layers_attr: str = "num_hidden_layers"
    config_hidden_attr: str = "hidden_size"
    all_head_size_attr: str | None = None
    position_names: tuple[str, ...] = ()
    fused_qkv: bool = False
    config_head_dim_attr: str | None = None
    probs_flag: str | None = None
    pad_offset_positions: bool = False
    ffn_input_path: str | None = "intermediate.dense"
    ffn_output_path: str | None = "output.dense"
    ffn_blocks: int = 1
    config_ffn_attr: str = "intermediate_size"

    def feed_forward(self, layer: nn.Module) -> FeedForwardParts:
        """The feed-forward projections of ``layer``.

        Raises
        ------
        UnsupportedModelError
            If the family's feed-forward block cannot be pruned neuron by neuron.
        """
        if self.ffn_input_path is None or self.ffn_output_path is None:
            raise UnsupportedModelError(
                f"the feed-forward neurons of {self.family} models cannot be pruned; prune its attention heads only"
            )
        return FeedForwardParts(input=_get(layer, self.ffn_input_path), output=_get(layer, self.ffn_output_path),
                                blocks=self.ffn_blocks)

    def num_neurons(self, config: Any) -> int:
        """Intermediate neurons per layer of the unpruned architecture."""
        return int(getattr(config, self.config_ffn_attr))

    def layers(self, model: nn.Module) -> list[nn.Module]:
        """The encoder layers, in order."""
        return list(_get(_get(model, self.base_model_attr), self.layers_path))

    def attention(self, layer: nn.Module) -> AttentionParts:
        """The attention modules of ``layer``."""
        module = _get(layer, self.attention_path)
        from torch import nn  # here: the table itself is read without torch

        present = tuple(n for n in self.position_names if isinstance(getattr(module, n, None), nn.Linear))
        names = self.qkv_names + present
        return AttentionParts(
            module=module,
            projections=tuple(getattr(module, name) for name in names),
            output=_get(layer, self.output_path),
            blocks=3 if self.fused_qkv else 1,
        )

    def num_layers(self, config: Any) -> int:
        return int(getattr(config, self.config_layers_attr))

    def num_heads(self, config: Any) -> int:
        """Heads per layer of the unpruned architecture."""
        return int(getattr(config, self.config_heads_attr))

    def head_dim(self, config: Any) -> int:
        explicit = getattr(config, self.config_head_dim_attr, None) if self.config_head_dim_attr else None
        if explicit:
            return int(explicit)
        return int(getattr(config, self.config_hidden_attr)) // self.num_heads(config)

    def max_positions(self, config: Any) -> int:
        """The longest input, in tokens, the position embeddings allow."""
        limit = int(getattr(config, "max_position_embeddings", 512))
        # RoBERTa-style embeddings number positions from padding_idx + 1, which costs that many slots.
        if self.pad_offset_positions:
            limit -= int(config.pad_token_id or 0) + 1
        return limit

    def set_head_count(self, parts: AttentionParts, heads: int, head_dim: int) -> None:
        """Record a new head count on the attention module after its projections were sliced."""
        if self.heads_attr is not None:
            setattr(parts.module, self.heads_attr, heads)
        if self.all_head_size_attr is not None:
            setattr(parts.module, self.all_head_size_attr, heads * head_dim)


def _get(obj: Any, dotted: str) -> Any:
    for name in dotted.split("."):
        obj = getattr(obj, name)
    return obj


def _bert_like(family: str, base: str, *, pad_offset_positions: bool = False) -> ModelAdapter:
    return ModelAdapter(
        family=family,
        model_types=(family,),
        base_model_attr=base,
        layers_path="encoder.layer",
        attention_path="attention.self",
        qkv_names=("query", "key", "value"),
        output_path="attention.output.dense",
        heads_attr="num_attention_heads",
        all_head_size_attr="all_head_size",
        pad_offset_positions=pad_offset_positions,
    )


def _roberta_like(family: str, base: str = "roberta") -> ModelAdapter:
    # RoBERTa's self-attention and output projection, under the family's own model type. CamemBERT
    # and data2vec-text are RoBERTa module for module; the pre-LayerNorm variants move the layer
    # norms, which lie outside the modules an adapter touches.
    return _bert_like(family, base, pad_offset_positions=True)


_ADAPTERS: dict[str, ModelAdapter] = {
    a.family: a
    for a in (
        _bert_like("bert", "bert"),
        _roberta_like("roberta"),
        _roberta_like("xlm-roberta"),
        _roberta_like("camembert"),
        _roberta_like("data2vec-text", "data2vec_text"),
        _roberta_like("roberta-prelayernorm", "roberta_prelayernorm"),
        _roberta_like("xlm-roberta-xl"),
        _bert_like("electra", "electra"),
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
            ffn_input_path="ffn.lin1",
            ffn_output_path="ffn.lin2",
            config_ffn_attr="hidden_dim",
        ),
        dataclasses.replace(
            _bert_like("deberta-v2", "deberta"),
            qkv_names=("query_proj", "key_proj", "value_proj"),
            # With share_att_key the relative positions go through query_proj/key_proj instead.
            position_names=("pos_key_proj", "pos_query_proj"),
            config_head_dim_attr="attention_head_size",
            probs_flag="output_attentions",
        ),
        ModelAdapter(
            family="modernbert",
            model_types=("modernbert",),
            base_model_attr="model",
            layers_path="layers",
            attention_path="attn",
            qkv_names=("Wqkv",),
            fused_qkv=True,
            output_path="attn.Wo",
            heads_attr=None,  # the module reads its head count off Wqkv's shape
            ffn_input_path="mlp.Wi",  # the gated linear unit: rows [0, I) the input, [I, 2I) the gate
            ffn_output_path="mlp.Wo",
            ffn_blocks=2,
        ),
    )
}

SUPPORTED_FAMILIES: tuple[str, ...] = tuple(_ADAPTERS)
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(t for a in _ADAPTERS.values() for t in a.model_types)


def get_adapter(model_or_config: Any) -> ModelAdapter:
    """Return the adapter for a model or its config.

    Raises
    ------
    UnsupportedModelError
        If the model type has no adapter; the message lists the supported model types.
    """
    config = getattr(model_or_config, "config", model_or_config)
    model_type = getattr(config, "model_type", None)
    for adapter in _ADAPTERS.values():
        if model_type in adapter.model_types:
            return adapter
    raise UnsupportedModelError(
        f"model type {model_type!r} is not supported; CAHP supports sequence classifiers of the "
        f"model types {', '.join(SUPPORTED_MODEL_TYPES)}"
    )


