"""Physical removal of feed-forward neurons and whole sub-layers: the pruned model computes the gated one."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from cahp_engine.data import LabelledTexts, encode
from cahp_engine.errors import InvalidInputError, ModelLoadError, UnsupportedModelError
from cahp_engine.export import export_onnx, quantize_int8
from cahp_engine.models import (
    current_kept_heads,
    current_kept_neurons,
    gate_heads,
    gate_neurons,
    get_adapter,
    heads_per_layer,
    load_pruned,
    neuron_record,
    neurons_per_layer,
    prune_heads,
    prune_neurons,
    save_pruned,
)
from tests.support.tiny_models import FAMILIES, LAYOUTS, make_classifier, make_texts, make_tokenizer

LAYERS, HEADS, HEAD_DIM = 3, 4, 8
HIDDEN = HEADS * HEAD_DIM
NEURONS = 2 * HIDDEN  # the tiny configs' intermediate size
TEXTS = ["good movie", "the plot was very boring and not fun at all", "fun", "a weak story but strong actor"]
# Non-uniform: layer 0 keeps 5 neurons, layer 1 none (its feed-forward block is skipped), layer 2 keeps 40.
KEPT = {0: [0, 3, 7, 20, 63], 1: [], 2: list(range(0, 64, 2)) + list(range(1, 17, 2))}


def _model(family: str) -> torch.nn.Module:
    model = make_classifier(family, layers=LAYERS, heads=HEADS, head_dim=HEAD_DIM)
    # Wider weights and drawn biases, as in the head surgery tests: every neuron and bias then shows.
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() == 2 or name.endswith(".bias"):
                parameter.normal_(0.0, 0.2, generator=generator)
    return model.eval()


def _batch(padding_side: str = "right") -> dict[str, torch.Tensor]:
    tokenizer = make_tokenizer()
    tokenizer.padding_side = padding_side
    encoded = tokenizer(TEXTS, padding=True, return_tensors="pt")
    return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}


def _neuron_gates(kept: dict[int, list[int]]) -> list[torch.Tensor]:
    return [torch.tensor([1.0 if n in kept.get(layer, range(NEURONS)) else 0.0 for n in range(NEURONS)])
            for layer in range(LAYERS)]


@torch.no_grad()
def _logits(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return model(**batch).logits


@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("family", FAMILIES)
def test_pruned_neurons_compute_the_gated_model(family: str, padding_side: str) -> None:
    model = _model(family)
    batch = _batch(padding_side)
    unpruned = _logits(model, batch)
    with gate_neurons(model, _neuron_gates(KEPT)):
        gated = _logits(model, batch)
    assert not torch.allclose(gated, unpruned, atol=1e-3)  # the gates matter

    before = sum(p.numel() for p in model.parameters())
    result = prune_neurons(model, KEPT)

    torch.testing.assert_close(_logits(model, batch), gated, atol=1e-5, rtol=0)
    assert neurons_per_layer(model) == [5, 0, 40]
    assert result.kept == tuple(tuple(sorted(KEPT[layer])) for layer in range(LAYERS))
    assert (result.neurons_before, result.neurons_after) == (LAYERS * NEURONS, 45)
    # Per neuron: one row of the input projection (two for ModernBERT's gated Wi) with its bias entry,
    # and one column of the output projection. ModernBERT has no biases.
    blocks, bias = (2, 0) if family == "modernbert" else (1, 1)
    per_neuron = blocks * (HIDDEN + bias) + HIDDEN
    removed = LAYERS * NEURONS - 45
    assert result.params_before == before
    assert before - result.params_after == removed * per_neuron == before - sum(p.numel() for p in model.parameters())
    parts = get_adapter(model).feed_forward(get_adapter(model).layers(model)[1])
    assert parts.input.weight.shape == (0, HIDDEN) and parts.output.weight.shape == (HIDDEN, 0)


@pytest.mark.parametrize("family", FAMILIES)
def test_heads_and_neurons_together_and_empty_sub_layers(family: str) -> None:
    # Layer 1 loses every head AND every neuron: both of its sub-layers are skipped.
    heads = {0: [1, 3], 1: [], 2: [0, 2, 3]}
    model = _model(family)
    batch = _batch("left")
    head_gates = [torch.tensor([1.0 if h in heads[layer] else 0.0 for h in range(HEADS)]) for layer in range(LAYERS)]
    with gate_heads(model, head_gates), gate_neurons(model, _neuron_gates(KEPT)):
        gated = _logits(model, batch)
    prune_neurons(model, KEPT)
    prune_heads(model, heads)  # either order; the record keeps both
    torch.testing.assert_close(_logits(model, batch), gated, atol=1e-5, rtol=0)
    assert current_kept_heads(model) == [(1, 3), (), (0, 2, 3)]
    assert [len(n) for n in current_kept_neurons(model)] == [5, 0, 40]
    assert model.config.cahp["format_version"] == 2

    # A skipped block never multiplies: its projections' own forward is not called.
    adapter = get_adapter(model)
    parts = adapter.feed_forward(adapter.layers(model)[1])
    calls: list[str] = []
    for linear in (parts.input, parts.output):
        linear.register_forward_hook(lambda m, i, o: calls.append(tuple(o.shape)))
    _logits(model, batch)
    assert calls[0][-1] == 0 and calls[1][-1] == HIDDEN
    # A copy runs on its own modules (the bypass is bound to the copy's projections).
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin_parts = adapter.feed_forward(adapter.layers(twin)[1])
        if twin_parts.output.bias is None:  # ModernBERT: no bias to change
            return
        twin_parts.output.bias.add_(torch.linspace(-1.0, 1.0, HIDDEN))  # not a constant: LN ignores one
    assert not torch.allclose(_logits(twin, batch), _logits(model, batch))


@pytest.mark.parametrize("family", LAYOUTS)
def test_a_second_pruning_composes_and_removed_neurons_cannot_come_back(family: str) -> None:
    model = _model(family)
    batch = _batch()
    prune_neurons(model, {0: list(range(10, 50))})
    with gate_neurons(model, [torch.tensor([1.0 if n in (12, 30, 49) else 0.0 for n in range(10, 50)]),
                              torch.ones(NEURONS), torch.ones(NEURONS)]):
        gated = _logits(model, batch)
    prune_neurons(model, {0: [49, 12, 30]})
    torch.testing.assert_close(_logits(model, batch), gated, atol=1e-5, rtol=0)
    assert current_kept_neurons(model)[0] == (12, 30, 49)
    state = copy.deepcopy(model.state_dict())
    with pytest.raises(InvalidInputError, match="neuron 5 of layer 0 was already removed"):
        prune_neurons(model, {1: [1], 0: [5]})
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize(("kept", "message"), [
    ({3: [1]}, r"layer index must be in \[0, 3\)"),
    ({0: [NEURONS]}, rf"neuron index in layer 0 must be in \[0, {NEURONS}\)"),
    ({0: [1, 1]}, "repeat an index"),
    ({0: "12"}, "must be a sequence of ints"),
    ([1, 2], "must map layer index"),
])
def test_invalid_neuron_indices_are_refused(kept: object, message: str) -> None:
    model = _model("bert")
    with pytest.raises(InvalidInputError, match=message):
        prune_neurons(model, kept)  # type: ignore[arg-type]
    assert neurons_per_layer(model) == [NEURONS] * LAYERS


def test_a_family_whose_feed_forward_cannot_be_cut_is_refused_before_any_change(monkeypatch) -> None:
    from cahp_engine.models import _families

    model = _model("bert")
    adapter = dataclasses.replace(get_adapter(model), ffn_input_path=None)
    monkeypatch.setitem(_families._ADAPTERS, "bert", adapter)
    with pytest.raises(UnsupportedModelError, match="feed-forward neurons of bert models cannot be pruned"):
        prune_neurons(model, {0: [1]})
    assert getattr(model.config, "cahp", None) is None


@pytest.mark.parametrize("family", FAMILIES)
def test_non_uniform_layers_survive_save_and_load(family: str, tmp_path: Path) -> None:
    model = _model(family)
    prune_heads(model, {1: []})
    prune_neurons(model, KEPT)
    batch = _batch("left")
    save_pruned(model, make_tokenizer(), tmp_path)
    record = json.loads((tmp_path / "config.json").read_text())["cahp"]
    assert record["kept_neurons"]["1"] == [] and len(record["kept_neurons"]["2"]) == 40
    loaded = load_pruned(tmp_path)
    assert neurons_per_layer(loaded) == [5, 0, 40] and heads_per_layer(loaded) == [HEADS, 0, HEADS]
    torch.testing.assert_close(_logits(loaded, batch), _logits(model, batch), atol=1e-6, rtol=0)


@pytest.mark.parametrize(("edit", "message"), [
    ({"num_neurons": 7}, "says num_neurons=7"),
    ({"format_version": 1}, "keeps neurons but has format_version 1"),
    ({"kept_neurons": {"0": [1]}}, "must list the neurons of all 3 layers"),
    ({"kept_neurons": {"0": [NEURONS], "1": [], "2": []}}, "neurons distinct and in"),
])
def test_malformed_neuron_records_are_refused(edit: dict, message: str) -> None:
    model = _model("bert")
    prune_neurons(model, {0: [1, 2]})
    model.config.cahp = {**model.config.cahp, **edit}
    with pytest.raises(ModelLoadError, match=message):
        neuron_record(model.config)


@pytest.mark.slow  # an ONNX export, int8 quantisation and onnxruntime sessions per layout
@pytest.mark.parametrize("family", LAYOUTS)
def test_non_uniform_model_exports_to_onnx_and_int8_with_parity(family: str, tmp_path: Path) -> None:
    model = _model(family)
    prune_heads(model, {1: [], 2: [0, 2]})
    prune_neurons(model, KEPT)
    texts, labels = make_texts(24, seed=3)
    rows = encode(make_tokenizer(), LabelledTexts(tuple(texts), labels, ("a", "b", "c")), max_length=32)
    result = export_onnx(model, make_tokenizer(), tmp_path / "onnx", data=rows)
    assert result.parity is not None and result.parity.passed and result.parity.max_abs_diff <= 1e-4
    assert result.neurons_per_layer == (5, 0, 40) and result.heads_per_layer == (HEADS, 0, 2)
    config = json.loads((tmp_path / "onnx" / "config.json").read_text())
    assert [len(config["cahp"]["kept_neurons"][str(i)]) for i in range(LAYERS)] == [5, 0, 40]
    int8 = quantize_int8(tmp_path / "onnx", tmp_path / "int8", model=model, parity_data=rows, eval_data=rows)
    graph = onnx.load(str(tmp_path / "int8" / "model.onnx"))
    assert int8.quantized_nodes == sum(n.op_type == "MatMulInteger" for n in graph.graph.node) > 0
    # The int8 graph runs on every sample; how far it moves these random wide weights is not a property of pruning.
    assert int8.deviation is not None and int8.deviation.samples == len(rows)
    assert np.isfinite(int8.deviation.max_abs_diff)


@pytest.mark.parametrize("family", LAYOUTS)
def test_load_classifier_reads_a_neuron_pruned_directory(family: str, tmp_path: Path) -> None:
    from cahp_engine.models import load_classifier

    model = _model(family)
    prune_neurons(model, KEPT)
    save_pruned(model, make_tokenizer(), tmp_path)
    loaded = load_classifier(str(tmp_path))
    assert neurons_per_layer(loaded.model) == [5, 0, 40] and loaded.classifier_trained
    batch = _batch()
    torch.testing.assert_close(_logits(loaded.model, batch), _logits(model, batch), atol=1e-6, rtol=0)


def test_the_model_card_shows_each_layers_neurons_beside_its_heads() -> None:
    from cahp_engine.export import ModelCardInputs, build_model_card

    inputs = ModelCardInputs(family="bert", num_layers=3, num_heads=4, kept_heads=((0, 2), (), (1,)),
                             neurons_per_layer=(5, 0, 40), num_neurons=NEURONS)
    card = build_model_card(inputs)
    text = str(card)
    assert "| layer | heads kept | original indices | feed-forward neurons kept |" in text
    assert f"| 1 | 0 / 4 | none (attention skipped) | 0 / {NEURONS} (feed-forward skipped) |" in text
    assert f"| 2 | 1 / 4 | 1 | 40 / {NEURONS} |" in text
    assert card.data.cahp["neurons_per_layer"] == [5, 0, 40]
    heads_only = str(build_model_card(ModelCardInputs(family="bert", num_layers=1, num_heads=4, kept_heads=((0,),))))
    assert "feed-forward" not in heads_only
    with pytest.raises(InvalidInputError, match="`neurons_per_layer` must give all 3 layers a count"):
        ModelCardInputs(family="bert", num_layers=3, num_heads=4, kept_heads=((0,), (), (1,)),
                        neurons_per_layer=(5, 0), num_neurons=NEURONS)


@pytest.mark.slow  # an ONNX export, its parity check and a latency comparison
def test_exporting_a_saved_neuron_pruned_checkpoint_checks_parity_and_writes_the_neuron_map(tmp_path: Path) -> None:
    from cahp_engine.export import export_checkpoint

    model = _model("bert")
    prune_heads(model, {1: []})
    prune_neurons(model, KEPT)
    save_pruned(model, make_tokenizer(), tmp_path / "model")
    result = export_checkpoint(tmp_path / "model", tmp_path / "out", latency_repeats=2, latency_warmup=1)
    assert result.onnx.parity is not None and result.onnx.parity.passed
    assert result.onnx.neurons_per_layer == (5, 0, 40)
    card = (tmp_path / "out" / "README.md").read_text()
    assert f"| 1 | 0 / {HEADS} | none (attention skipped) | 0 / {NEURONS} (feed-forward skipped) |" in card
