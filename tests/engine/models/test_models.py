"""Loading user-named classifiers from local directories and the (offline) hub cache."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import transformers as tf

from cahp_engine.errors import InvalidInputError, ModelLoadError, UnsupportedModelError
from cahp_engine.models import LoadedClassifier, heads_per_layer, load_classifier, prune_heads, save_pruned
from tests.support.tiny_models import FAMILIES, make_classifier, make_config, make_tokenizer


def _save(model: torch.nn.Module, path: Path, *, tokenizer: bool = True) -> Path:
    model.save_pretrained(path)
    if tokenizer:
        make_tokenizer().save_pretrained(path)
    return path


@torch.no_grad()
def _logits(model: torch.nn.Module) -> torch.Tensor:
    encoded = make_tokenizer()(["good film", "a very dull plot"], padding=True, return_tensors="pt")
    return model(input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"]).logits


def _fake_hub_cache(cache: Path, repo: str, fill) -> None:
    """Lay out ``cache`` as huggingface_hub does, so an offline hub id resolves from it."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    root = cache / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(commit)
    fill(root / "snapshots" / commit)


@pytest.mark.parametrize("family", FAMILIES)
def test_saved_classifier_loads_with_its_tokenizer(family: str, tmp_path: Path) -> None:
    model = make_classifier(family, num_labels=3)
    _save(model, tmp_path)

    loaded = load_classifier(str(tmp_path), device="cpu")

    assert isinstance(loaded, LoadedClassifier)
    assert (loaded.family, loaded.source, loaded.revision) == (family, str(tmp_path), None)
    assert loaded.classifier_trained
    assert (loaded.num_heads, loaded.num_layers) == (4, 2)
    assert not loaded.model.training
    assert loaded.tokenizer("good film")["input_ids"] == make_tokenizer()("good film")["input_ids"]
    torch.testing.assert_close(_logits(loaded.model), _logits(model), atol=0, rtol=0)


@pytest.mark.parametrize(("family", "bare"), [("bert", tf.BertModel), ("distilbert", tf.DistilBertModel)])
def test_bare_encoder_loads_with_an_untrained_head(family: str, bare: type, tmp_path: Path) -> None:
    torch.manual_seed(0)
    _save(bare(make_config(family)), tmp_path)
    loaded = load_classifier(str(tmp_path))
    assert not loaded.classifier_trained
    assert loaded.family == family


def test_num_labels_that_differ_recreate_the_head(tmp_path: Path) -> None:
    _save(make_classifier("roberta", num_labels=3), tmp_path)
    assert load_classifier(str(tmp_path), num_labels=3).classifier_trained
    other = load_classifier(str(tmp_path), num_labels=5)
    assert not other.classifier_trained
    assert other.model.config.num_labels == 5
    assert _logits(other.model).shape == (2, 5)


def test_a_recreated_head_is_drawn_from_the_seed_and_leaves_the_global_generator_alone(tmp_path: Path) -> None:
    # torch's start-up seed is random, so an unseeded head made every run on a base model another model.
    _save(make_classifier("bert", num_labels=3), tmp_path)
    state = torch.random.get_rng_state()

    def head(seed: int) -> torch.Tensor:
        loaded = load_classifier(str(tmp_path), num_labels=5, seed=seed)
        assert not loaded.classifier_trained
        return loaded.model.classifier.weight.detach().clone()

    first, again, other = head(7), head(7), head(8)
    torch.testing.assert_close(first, again, atol=0, rtol=0)
    assert not torch.equal(first, other)
    assert torch.equal(torch.random.get_rng_state(), state)
    # The encoder's weights come from the checkpoint whatever the seed.
    a = load_classifier(str(tmp_path), num_labels=5, seed=7).model.bert.encoder.layer[0].attention.self.query.weight
    b = load_classifier(str(tmp_path), num_labels=5, seed=8).model.bert.encoder.layer[0].attention.self.query.weight
    assert torch.equal(a, b)


@pytest.mark.parametrize("bad", [0, 1, 2.0, True, "3"])
def test_num_labels_must_be_an_integer_of_at_least_two(bad: object, tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="`num_labels` must be an integer >= 2"):
        load_classifier(str(tmp_path), num_labels=bad)  # type: ignore[arg-type]


def test_pruned_directory_goes_through_load_pruned(tmp_path: Path) -> None:
    model = make_classifier("xlm-roberta", num_labels=3)
    prune_heads(model, {0: [1], 1: []})
    save_pruned(model, make_tokenizer(), tmp_path)

    loaded = load_classifier(str(tmp_path))

    assert loaded.classifier_trained
    assert heads_per_layer(loaded.model) == [1, 0]
    assert loaded.num_heads == 4  # of the original architecture
    torch.testing.assert_close(_logits(loaded.model), _logits(model), atol=0, rtol=0)
    with pytest.raises(ModelLoadError, match="pruned classifier with 3 labels"):
        load_classifier(str(tmp_path), num_labels=4)


def test_missing_local_paths_are_named(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(ModelLoadError, match=f"local model directory '{missing}' does not exist"):
        load_classifier(str(missing))
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_classifier("./models/not-here")
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_classifier("runs/pruned/model")


def test_directory_without_config_or_a_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="has no config.json"):
        load_classifier(str(tmp_path))
    file = tmp_path / "weights.safetensors"
    file.write_bytes(b"")
    with pytest.raises(ModelLoadError, match="is a file"):
        load_classifier(str(file))


def test_pickled_only_checkpoint_is_refused(tmp_path: Path) -> None:
    model = make_classifier("bert")
    _save(model, tmp_path)
    (tmp_path / "model.safetensors").unlink()
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match="(?i)safetensors only.*convert"):
        load_classifier(str(tmp_path))


def test_missing_tokenizer_is_refused(tmp_path: Path) -> None:
    _save(make_classifier("electra"), tmp_path, tokenizer=False)
    with pytest.raises(ModelLoadError, match="has no tokenizer files"):
        load_classifier(str(tmp_path))


def test_a_sentencepiece_only_tokenizer_says_what_it_needs(tmp_path: Path) -> None:
    # DeBERTa-v3's released checkpoints ship spm.model and no tokenizer.json.
    make_classifier("deberta-v2").save_pretrained(tmp_path)
    (tmp_path / "spm.model").write_bytes(b"\x0a\x05piece" * 8)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "DebertaV2Tokenizer"}))
    with pytest.raises(ModelLoadError, match="SentencePiece model without tokenizer.json: install the `sentencepiece`"):
        load_classifier(str(tmp_path))


def test_unsupported_families_are_refused(tmp_path: Path) -> None:
    tf.GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=40).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(UnsupportedModelError, match="'gpt2' is not supported.*bert"):
        load_classifier(str(tmp_path / "gpt2"))
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "config.json").write_text(json.dumps({"model_type": "no-such-family"}))
    with pytest.raises(UnsupportedModelError, match="'no-such-family' is not supported"):
        load_classifier(str(tmp_path / "odd"))


def test_unknown_hub_id_offline_says_what_to_check(tmp_path: Path) -> None:
    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    with pytest.raises(ModelLoadError, match=r"'someone/tiny-sst5' was not found on the Hugging Face hub or in "
                                             r"the local cache.*check the model id and revision.*local directory"):
        load_classifier("someone/tiny-sst5", cache_dir=str(tmp_path))
    with pytest.raises(ModelLoadError, match="not a valid hub model id|neither an existing directory"):
        load_classifier("not a model id!", cache_dir=str(tmp_path))


def test_hub_id_resolves_from_the_offline_cache(tmp_path: Path) -> None:
    model = make_classifier("bert")
    _fake_hub_cache(tmp_path, "someone/tiny", lambda snapshot: _save(model, snapshot))

    loaded = load_classifier("someone/tiny", cache_dir=str(tmp_path))

    assert (loaded.source, loaded.classifier_trained) == ("someone/tiny", True)
    torch.testing.assert_close(_logits(loaded.model), _logits(model), atol=0, rtol=0)
    with pytest.raises(ModelLoadError, match=r"revision v2\)"):
        load_classifier("someone/tiny", revision="v2", cache_dir=str(tmp_path))


def test_pruned_hub_model_resolves_from_the_offline_cache(tmp_path: Path) -> None:
    model = make_classifier("distilbert")
    prune_heads(model, {1: [0, 3]})
    _fake_hub_cache(tmp_path, "someone/pruned", lambda snapshot: save_pruned(model, make_tokenizer(), snapshot))

    loaded = load_classifier("someone/pruned", cache_dir=str(tmp_path))

    assert heads_per_layer(loaded.model) == [4, 2]
    torch.testing.assert_close(_logits(loaded.model), _logits(model), atol=0, rtol=0)
