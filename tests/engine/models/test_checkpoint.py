"""Saving and reloading pruned classifiers: same weights, same logits, safetensors only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers as tf

from cahp_engine.errors import ModelLoadError, UnsupportedModelError
from cahp_engine.models import heads_per_layer, load_pruned, prune_heads, save_pruned
from tests.support.tiny_models import FAMILIES, make_classifier, make_tokenizer

KEPT = {0: [2], 1: [], 2: [0, 1, 3]}


def _model(family: str, **overrides: object) -> torch.nn.Module:
    model = make_classifier(family, layers=3, heads=4, head_dim=8, **overrides)
    # Wider than the default init, so that a misplaced weight would move the logits visibly.
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.normal_(0.0, 0.2, generator=generator)
    return model


def _batch() -> dict[str, torch.Tensor]:
    encoded = make_tokenizer()(["good film", "the story was not very fun", "dull"], padding=True,
                               return_tensors="pt")
    return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}


@torch.no_grad()
def _logits(model: torch.nn.Module) -> torch.Tensor:
    return model(**_batch()).logits


def _assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


@pytest.mark.parametrize("family", FAMILIES)
def test_pruned_round_trip_gives_identical_logits(family: str, tmp_path: Path) -> None:
    model = _model(family)
    prune_heads(model, KEPT)
    save_pruned(model, make_tokenizer(), tmp_path)

    files = {p.name for p in tmp_path.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= files
    assert not any(name.endswith((".bin", ".pt", ".pkl")) for name in files)
    record = json.loads((tmp_path / "config.json").read_text())["cahp"]
    assert record == {"format_version": 1, "num_heads": 4, "kept_heads": {"0": [2], "1": [], "2": [0, 1, 3]}}

    loaded = load_pruned(tmp_path)

    assert not loaded.training
    assert type(loaded) is type(model)
    assert heads_per_layer(loaded) == [1, 0, 3]
    assert loaded.config.cahp == model.config.cahp
    _assert_same_weights(loaded, model)
    torch.testing.assert_close(_logits(loaded), _logits(model), atol=0, rtol=0)


@pytest.mark.parametrize(
    ("family", "overrides"),
    [
        ("deberta-v2", {"share_att_key": False, "pos_att_type": "p2c|c2p", "position_biased_input": True}),
        ("modernbert", {"attention_bias": True, "global_attn_every_n_layers": 3}),
    ],
)
def test_round_trip_rebuilds_layout_options_from_the_config(family: str, overrides: dict, tmp_path: Path) -> None:
    model = _model(family, **overrides)
    with torch.no_grad():  # non-zero biases, which these layouts slice too
        for name, parameter in model.named_parameters():
            if name.endswith(".bias"):
                parameter.normal_(0.0, 0.2)
    prune_heads(model, KEPT)
    save_pruned(model, make_tokenizer(), tmp_path)
    loaded = load_pruned(tmp_path)
    assert heads_per_layer(loaded) == [1, 0, 3]
    _assert_same_weights(loaded, model)
    torch.testing.assert_close(_logits(loaded), _logits(model), atol=0, rtol=0)


def test_saving_leaves_the_live_config_alone(tmp_path: Path) -> None:
    model = _model("bert")
    before = model.config.to_dict()
    save_pruned(model, make_tokenizer(), tmp_path)
    assert model.config.to_dict() == before


def test_unpruned_save_loads_as_a_plain_model_here_and_in_transformers(tmp_path: Path) -> None:
    model = _model("electra")
    save_pruned(model, make_tokenizer(), tmp_path)
    assert "cahp" not in json.loads((tmp_path / "config.json").read_text())

    loaded = load_pruned(tmp_path, device="cpu")
    assert getattr(loaded.config, "cahp", None) is None
    assert heads_per_layer(loaded) == [4, 4, 4]
    torch.testing.assert_close(_logits(loaded), _logits(model), atol=0, rtol=0)

    plain = tf.AutoModelForSequenceClassification.from_pretrained(tmp_path, use_safetensors=True).eval()
    torch.testing.assert_close(_logits(plain), _logits(model), atol=0, rtol=0)
    tokenizer = tf.AutoTokenizer.from_pretrained(tmp_path)
    assert tokenizer("good film")["input_ids"] == make_tokenizer()("good film")["input_ids"]


def test_reloaded_model_can_be_pruned_again_in_original_numbering(tmp_path: Path) -> None:
    model = _model("distilbert")
    prune_heads(model, KEPT)
    save_pruned(model, make_tokenizer(), tmp_path)
    loaded = load_pruned(tmp_path)
    result = prune_heads(loaded, {2: [3]})
    assert result.kept == ((2,), (), (3,))


def test_pickled_weights_are_refused(tmp_path: Path) -> None:
    model = _model("bert")
    save_pruned(model, make_tokenizer(), tmp_path)
    (tmp_path / "model.safetensors").unlink()
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match="safetensors only.*save_pretrained"):
        load_pruned(tmp_path)


def test_missing_directory_config_and_weights(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_pruned(tmp_path / "nowhere")
    with pytest.raises(ModelLoadError, match="has no config.json"):
        load_pruned(tmp_path)
    _model("bert").config.save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="has no model.safetensors"):
        load_pruned(tmp_path)


def test_weights_that_do_not_fit_the_record_are_refused(tmp_path: Path) -> None:
    model = _model("roberta")
    prune_heads(model, KEPT)
    save_pruned(model, make_tokenizer(), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["cahp"]["kept_heads"]["1"] = [0]  # claims a head the weights do not have
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="do not match the architecture"):
        load_pruned(tmp_path)


def test_unsupported_family_is_refused(tmp_path: Path) -> None:
    tf.GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=40).save_pretrained(tmp_path)
    with pytest.raises(UnsupportedModelError, match="'gpt2' is not supported"):
        load_pruned(tmp_path)


def test_a_pruned_model_written_by_save_pretrained_loads_too(tmp_path: Path) -> None:
    model = _model("bert")
    prune_heads(model, KEPT)
    model.save_pretrained(tmp_path)  # the record travels in config.json either way
    loaded = load_pruned(tmp_path)
    _assert_same_weights(loaded, model)
