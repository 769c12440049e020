"""Physical head removal: the pruned model computes what the gated unpruned model computes."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers as tf

from cahp_engine.errors import InvalidInputError, ModelLoadError, PipelineError
from cahp_engine.models import (
    current_kept_heads,
    eager_attention,
    gate_heads,
    get_adapter,
    heads_per_layer,
    prune_heads,
    pruning_record,
)
from tests.support.surgery import HEAD_DIM, HEADS, HIDDEN, KEPT, LAYERS
from tests.support.surgery import gates as _gates
from tests.support.surgery import padded_batch as _batch
from tests.support.surgery import spread_model as _model
from tests.support.tiny_models import FAMILIES, LAYOUTS


@torch.no_grad()
def _logits(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return model(**batch).logits


@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("family", FAMILIES)
def test_pruned_logits_equal_gated_logits(family: str, padding_side: str) -> None:
    model = _model(family)
    batch = _batch(padding_side)
    unpruned = _logits(model, batch)
    with gate_heads(model, _gates(KEPT)):
        gated = _logits(model, batch)
    assert not torch.allclose(gated, unpruned, atol=1e-4)  # the gates matter, so equality below means something

    result = prune_heads(model, KEPT)

    torch.testing.assert_close(_logits(model, batch), gated, atol=1e-5, rtol=0)
    assert heads_per_layer(model) == [2, 0, 3]
    assert result.kept == ((1, 3), (), (0, 2, 3))
    assert (result.heads_before, result.heads_after) == (LAYERS * HEADS, 5)


@pytest.mark.parametrize("family", FAMILIES)
def test_parameter_count_drops_by_the_sliced_rows_and_columns(family: str) -> None:
    model = _model(family)
    before = sum(p.numel() for p in model.parameters())
    result = prune_heads(model, KEPT)
    removed = LAYERS * HEADS - 5
    # Per head: d rows of W_q, W_k, W_v (each HIDDEN wide) and their biases, d columns of W_o.
    # ModernBERT's fused Wqkv loses 3 * d rows per head the same way; it has no biases.
    biases = 0 if family == "modernbert" else 3
    per_head = HEAD_DIM * (3 * HIDDEN + biases) + HEAD_DIM * HIDDEN
    assert result.params_before == before
    assert result.params_before - result.params_after == removed * per_head
    assert result.params_after == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("family", FAMILIES)
def test_eager_attentions_keep_one_entry_per_layer_with_the_kept_heads(family: str) -> None:
    model = _model(family)
    batch = _batch("right")
    with eager_attention(model), torch.no_grad():
        full = model(**batch, output_attentions=True, output_hidden_states=True).attentions
        prune_heads(model, KEPT)
        pruned = model(**batch, output_attentions=True, output_hidden_states=True)
    assert len(pruned.attentions) == LAYERS
    assert len(pruned.hidden_states) == LAYERS + 1
    for layer, heads in KEPT.items():
        assert pruned.attentions[layer].shape[1] == len(heads)
        # Heads before the first pruned layer see identical inputs, so their maps are identical.
        if layer == 0:
            torch.testing.assert_close(pruned.attentions[0], full[0][:, heads], atol=1e-6, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_zero_head_layer_adds_only_the_output_bias(family: str) -> None:
    model = _model(family)
    adapter = get_adapter(model)
    prune_heads(model, {0: []})
    layer = adapter.layers(model)[0]
    parts = adapter.attention(layer)
    assert parts.output.weight.shape == (HIDDEN, 0)
    seen: list[torch.Tensor] = []
    handle = parts.output.register_forward_hook(lambda _m, _i, out: seen.append(out))
    try:
        _logits(model, _batch("left"))
    finally:
        handle.remove()
    (out,) = seen
    bias = parts.output.bias if parts.output.bias is not None else torch.zeros(HIDDEN)  # ModernBERT: no bias
    torch.testing.assert_close(out, bias.expand_as(out), atol=0, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_second_pruning_composes_with_the_first(family: str) -> None:
    model = _model(family)
    batch = _batch("right")
    final = {0: [3], 1: [2], 2: []}
    with gate_heads(model, _gates(final)):
        expected = _logits(model, batch)

    prune_heads(model, {0: [0, 1, 3], 1: [2]})
    result = prune_heads(model, {0: [3], 2: []})  # layer 1 keeps what it has, in original numbering

    assert result.kept == ((3,), (2,), ())
    assert (result.heads_before, result.heads_after) == (3 + 1 + 4, 2)
    torch.testing.assert_close(_logits(model, batch), expected, atol=1e-5, rtol=0)
    assert model.config.cahp == {"format_version": 1, "num_heads": HEADS,
                                 "kept_heads": {"0": [3], "1": [2], "2": []}}


def test_keeping_a_removed_head_is_refused_and_changes_nothing() -> None:
    model = _model("bert")
    prune_heads(model, {0: [0, 2]})
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(InvalidInputError, match=r"head 1 of layer 0 was already removed.*\[0, 2\]"):
        prune_heads(model, {2: [1], 0: [1, 2]})
    assert current_kept_heads(model) == [(0, 2), (0, 1, 2, 3), (0, 1, 2, 3)]
    assert {k: v.shape for k, v in model.state_dict().items()} == {k: v.shape for k, v in state.items()}


@pytest.mark.parametrize(
    ("kept", "message"),
    [
        ({LAYERS: [0]}, r"layer index must be in \[0, 3\), got 3"),
        ({-1: [0]}, r"layer index must be in \[0, 3\), got -1"),
        ({0: [HEADS]}, r"head index in layer 0 must be in \[0, 4\).*got 4"),
        ({0: [-1]}, r"head index in layer 0 must be in \[0, 4\).*got -1"),
        ({0: [1, 1]}, r"repeat an index"),
        ({0: ["1"]}, r"must be an int"),
        ({0: 1}, r"must be a sequence of ints"),
        ([[0]], r"`kept` must map layer index"),
    ],
)
def test_invalid_indices_raise_before_anything_changes(kept: object, message: str) -> None:
    model = _model("distilbert")
    with pytest.raises(InvalidInputError, match=message):
        prune_heads(model, kept)  # type: ignore[arg-type]
    assert heads_per_layer(model) == [HEADS] * LAYERS
    assert getattr(model.config, "cahp", None) is None


def test_numpy_and_tensor_indices_are_accepted() -> None:
    np = pytest.importorskip("numpy")
    model = _model("bert")
    result = prune_heads(model, {np.int64(0): np.array([3, 1]), 1: torch.tensor([0])})
    assert result.kept[:2] == ((1, 3), (0,))


def test_record_survives_config_dict_and_json_round_trips(tmp_path) -> None:
    model = _model("roberta")
    prune_heads(model, KEPT)
    config = model.config
    again = type(config).from_dict(config.to_dict())
    assert again.cahp == config.cahp
    config.save_pretrained(tmp_path)
    loaded = tf.AutoConfig.from_pretrained(tmp_path)
    assert pruning_record(loaded) == {0: (1, 3), 1: (), 2: (0, 2, 3)}


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"format_version": 3, "num_heads": HEADS, "kept_heads": {}}, "format_version 3"),
        ({"format_version": 1, "num_heads": 12, "kept_heads": {}}, "num_heads=12"),
        ({"format_version": 1, "num_heads": HEADS, "kept_heads": {"0": [0]}}, "must list all 3 layers"),
        ({"format_version": 1, "num_heads": HEADS, "kept_heads": {"0": [9], "1": [], "2": []}}, r"\[0, 4\)"),
        ({"format_version": 1, "num_heads": HEADS, "kept_heads": {"x": [0]}}, "non-integer"),
        ([1, 2], "must be a mapping"),
    ],
)
def test_malformed_records_are_rejected(record: object, message: str) -> None:
    config = _model("bert").config
    config.cahp = record
    with pytest.raises(ModelLoadError, match=message):
        pruning_record(config)


def test_deepcopy_of_a_model_with_an_empty_layer_runs_on_its_own_modules() -> None:
    model = _model("distilbert")  # its output projection lives inside the attention module
    prune_heads(model, {1: []})
    batch = _batch("right")
    twin = copy.deepcopy(model)
    twin_attention = get_adapter(twin).attention(get_adapter(twin).layers(twin)[1]).module
    assert twin_attention.forward.args[0] is twin_attention
    torch.testing.assert_close(_logits(twin, batch), _logits(model, batch), atol=0, rtol=0)
    with torch.no_grad():
        get_adapter(twin).attention(get_adapter(twin).layers(twin)[1]).output.bias.add_(torch.linspace(-1, 1, HIDDEN))
    assert not torch.allclose(_logits(twin, batch), _logits(model, batch))


@pytest.mark.parametrize("family", LAYOUTS)
def test_pruned_model_trains_and_gates_with_an_empty_layer(family: str) -> None:
    model = _model(family)
    prune_heads(model, KEPT)
    batch = _batch("right")
    model.train()
    loss = model(**batch, labels=torch.tensor([0, 1, 2, 0])).loss
    loss.backward()
    parts = get_adapter(model).attention(get_adapter(model).layers(model)[0])
    query = parts.projections[0]
    assert query.weight.grad is not None and query.weight.grad.shape == (parts.blocks * 2 * HEAD_DIM, HIDDEN)
    model.eval()
    gates = [torch.ones(n) for n in heads_per_layer(model)]
    with gate_heads(model, gates):
        gated = _logits(model, batch)
    torch.testing.assert_close(gated, _logits(model, batch), atol=0, rtol=0)


def test_a_record_that_disagrees_with_the_shapes_is_a_pipeline_error() -> None:
    model = _model("electra")
    prune_heads(model, {0: [1]})
    del model.config.cahp  # sliced, but the original numbering is lost
    with pytest.raises(PipelineError, match="carries no `cahp` record"):
        prune_heads(model, {1: [0]})


@pytest.mark.parametrize("family", ["roberta", "distilbert", "modernbert"])
def test_empty_layer_never_reaches_the_attention_kernel(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Fused GPU kernels (flash, cuDNN) reject zero-size inputs; emulate that refusal on CPU.
    kernel = torch.nn.functional.scaled_dot_product_attention

    def strict_kernel(query: torch.Tensor, *args, **kwargs):  # type: ignore[no-untyped-def]
        if query.numel() == 0:
            raise RuntimeError("zero-size input")
        return kernel(query, *args, **kwargs)

    model = _model(family)
    assert model.config._attn_implementation == "sdpa"
    batch = _batch("left")
    with gate_heads(model, _gates(KEPT)):
        expected = _logits(model, batch)
    prune_heads(model, KEPT)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", strict_kernel)
    torch.testing.assert_close(_logits(model, batch), expected, atol=1e-5, rtol=0)


# DeBERTa-v2 configurations with their own relative-position projections (``share_att_key=False``),
# absolute positions added to the input and the convolution after the first layer (deberta-v2-xlarge).
DEBERTA_SEPARATE = {"share_att_key": False, "position_biased_input": True, "conv_kernel_size": 3,
                    "position_buckets": -1, "max_relative_positions": 16, "norm_rel_ebd": "none"}


@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("pos_att_type", ["p2c|c2p", "c2p", "p2c"])
def test_deberta_separate_position_projections_lose_the_same_heads(pos_att_type: str, padding_side: str) -> None:
    model = _model("deberta-v2", pos_att_type=pos_att_type, **DEBERTA_SEPARATE)
    adapter = get_adapter(model)
    present = [{"c2p": "pos_key_proj", "p2c": "pos_query_proj"}[kind] for kind in pos_att_type.split("|")]
    batch = _batch(padding_side)
    with gate_heads(model, _gates(KEPT)):
        gated = _logits(model, batch)
    assert not torch.allclose(gated, _logits(model, batch), atol=1e-4)

    result = prune_heads(model, KEPT)

    torch.testing.assert_close(_logits(model, batch), gated, atol=1e-5, rtol=0)
    for layer, heads in KEPT.items():
        module = adapter.attention(adapter.layers(model)[layer]).module
        assert module.num_attention_heads == len(heads) and module.all_head_size == len(heads) * HEAD_DIM
        for name in ("query_proj", "key_proj", "value_proj", *present):
            assert getattr(module, name).weight.shape == (len(heads) * HEAD_DIM, HIDDEN)
            assert getattr(module, name).bias.shape == (len(heads) * HEAD_DIM,)
    # Per head: d rows (and bias entries) of q, k, v and of each position projection, d columns of the output.
    per_head = HEAD_DIM * (3 + len(present)) * (HIDDEN + 1) + HEAD_DIM * HIDDEN
    assert result.params_before - result.params_after == (LAYERS * HEADS - 5) * per_head


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_modernbert_fused_qkv_slices_every_block_in_global_and_local_layers(implementation: str,
                                                                            padding_side: str) -> None:
    model = _model("modernbert", attention_bias=True)
    model.set_attn_implementation(implementation)
    adapter = get_adapter(model)
    assert model.config.layer_types == ["full_attention", "sliding_attention", "full_attention"]
    batch = _batch(padding_side)
    # The shortest sentence has more padding than the local window (2 tokens each side) spans, so
    # some padded rows of the local layer see no real token at all.
    mask = batch["attention_mask"]
    assert int(mask.shape[1] - mask.sum(dim=1).min()) > model.config.sliding_window
    kept = {0: [1, 3], 1: [0, 2, 3], 2: []}  # uneven heads in the local layer, a global layer emptied
    with gate_heads(model, _gates(kept)):
        gated = _logits(model, batch)

    prune_heads(model, kept)

    torch.testing.assert_close(_logits(model, batch), gated, atol=1e-5, rtol=0)
    for layer, heads in kept.items():
        parts = adapter.attention(adapter.layers(model)[layer])
        assert parts.module.Wqkv.weight.shape == (3 * len(heads) * HEAD_DIM, HIDDEN)
        assert parts.module.Wqkv.bias.shape == (3 * len(heads) * HEAD_DIM,)
        assert parts.module.Wo.weight.shape == (HIDDEN, len(heads) * HEAD_DIM)
        assert parts.module.head_dim == HEAD_DIM  # rotary embeddings still rotate d-wide heads
