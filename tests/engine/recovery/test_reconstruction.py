"""Layer-wise reconstruction on tiny real models: it lowers each layer's error against dense, is
deterministic, refuses what it cannot solve, and survives save, load, ONNX and int8."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from cahp_engine._torch import model_inputs
from cahp_engine.data import LabelledTexts, collate, encode
from cahp_engine.errors import InvalidInputError
from cahp_engine.export import export_onnx, quantize_int8
from cahp_engine.models import load_pruned, prune_heads, save_pruned
from cahp_engine.recovery import ReconstructionOptions, reconstruct
from tests.support.tiny_models import FAMILIES, make_classifier, make_texts, make_tokenizer

KEPT = {0: [1, 3], 1: [2], 2: [0, 1, 2]}


def _dense(family: str = "bert") -> torch.nn.Module:
    # Wider weights than the default init, as in the export tests: with std 0.02 removing heads barely
    # moves a layer's output, and there would be nothing to reconstruct.
    model = make_classifier(family, layers=3, heads=4)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() == 2 or name.endswith(".bias"):
                parameter.normal_(0.0, 0.2, generator=generator)
    return model.eval()


def _rows(n: int, seed: int):
    texts, labels = make_texts(n, seed=seed)
    return encode(make_tokenizer(), LabelledTexts(tuple(texts), labels, ("a", "b", "c")), max_length=32)


def _batches(n: int = 128, seed: int = 1, size: int = 32) -> list[dict]:
    rows = _rows(n, seed)
    return [collate(rows, np.arange(i, min(i + size, n))) for i in range(0, n, size)]


def _layer_errors(dense: torch.nn.Module, pruned: torch.nn.Module, batches: list[dict]) -> np.ndarray:
    """Each layer's output error against dense, ``||h_p - h_d||^2 / ||h_d||^2`` over real tokens."""
    num = den = None
    with torch.no_grad():
        for batch in batches:
            mask = batch["attention_mask"].bool()
            hd = dense(**model_inputs(dense, batch), output_hidden_states=True).hidden_states[1:]
            hp = pruned(**model_inputs(pruned, batch), output_hidden_states=True).hidden_states[1:]
            n = np.array([float(((a - b)[mask] ** 2).sum()) for a, b in zip(hd, hp, strict=True)])
            d = np.array([float((a[mask] ** 2).sum()) for a in hd])
            num, den = (n, d) if num is None else (num + n, den + d)
    assert num is not None and den is not None
    return num / den


def _pruned(dense: torch.nn.Module) -> torch.nn.Module:
    pruned = copy.deepcopy(dense)
    prune_heads(pruned, KEPT)
    return pruned.eval()


@pytest.mark.parametrize("family", FAMILIES)
def test_every_layer_comes_closer_to_dense_on_rows_it_was_not_fitted_on(family: str) -> None:
    dense = _dense(family)
    pruned = _pruned(dense)
    held_out = _batches(64, seed=7)
    before = _layer_errors(dense, pruned, held_out)

    result = reconstruct(dense, pruned, _batches(), seed=0)

    after = _layer_errors(dense, pruned, held_out)
    assert (after < before).all(), (before, after)
    assert [(f.layer, f.sublayer) for f in result.fits] == [(0, "attention"), (1, "attention"), (2, "attention")]
    assert [f.units for f in result.fits] == [2, 1, 3]
    assert all(f.error_after < f.error_before for f in result.fits)
    assert result.rows == sum(int(b["attention_mask"].sum()) for b in _batches())
    assert result.method == "ridge" and result.target == "residual" and result.seconds > 0


@pytest.mark.parametrize("family", FAMILIES)
def test_refitting_the_feed_forward_projections_too_brings_every_layer_closer_the_residual_target_closest(
        family: str) -> None:
    # With heads removed and every neuron kept, the feed-forward blocks still see the pruned attention's
    # output: refitting their projections too absorbs part of what the attention refit left, and matching
    # the sum the family adds the block to (its residual) absorbs more than matching the block alone.
    dense = _dense(family)
    held_out = _batches(64, seed=7)
    errors = {}
    for name, options in (("attention", ReconstructionOptions()),
                          ("block", ReconstructionOptions(sublayers=("attention", "ffn"))),
                          ("residual", ReconstructionOptions(sublayers=("attention", "ffn"), ffn_target="residual"))):
        pruned = _pruned(dense)
        result = reconstruct(dense, pruned, _batches(), options)
        errors[name] = _layer_errors(dense, pruned, held_out)
    assert [(f.layer, f.sublayer) for f in result.fits] == [(i, s) for i in range(3) for s in ("attention", "ffn")]
    assert result.target == "residual" and result.ffn_target == "residual"
    assert "feed-forward residual" in result.describe()
    assert (errors["block"] < errors["attention"]).all(), errors
    assert (errors["residual"] < errors["block"]).all(), errors


def test_per_head_scales_fit_their_systems_but_the_full_refit_comes_closer() -> None:
    dense = _dense("bert")
    scaled, refit = _pruned(dense), _pruned(dense)
    result = reconstruct(dense, scaled, _batches(), ReconstructionOptions(method="scales"))
    assert all(f.error_after < f.error_before for f in result.fits)
    assert [f.unknowns for f in result.fits] == [2, 1, 3]  # one scale per kept head
    reconstruct(dense, refit, _batches())
    held_out = _batches(64, seed=7)
    assert (_layer_errors(dense, refit, held_out) < _layer_errors(dense, scaled, held_out)).all()


def test_the_block_target_matches_each_dense_block_but_not_the_drift_below() -> None:
    # Matching each attention block alone fits its own system, but leaves the drift of the layers below
    # in the residual stream: why the residual target is the default.
    dense = _dense("bert")
    pruned = _pruned(dense)
    result = reconstruct(dense, pruned, _batches(), ReconstructionOptions(target="block"))
    assert all(f.error_after < f.error_before for f in result.fits)
    residual = _pruned(dense)
    reconstruct(dense, residual, _batches())
    held_out = _batches(64, seed=7)
    assert _layer_errors(dense, residual, held_out)[-1] < _layer_errors(dense, pruned, held_out)[-1]


def test_the_same_inputs_give_the_same_weights_and_a_seed_only_draws_rows() -> None:
    dense = _dense("bert")
    one, two = _pruned(dense), _pruned(dense)
    first = reconstruct(dense, one, _batches(), ReconstructionOptions(max_rows=200), seed=3)
    second = reconstruct(dense, two, _batches(), ReconstructionOptions(max_rows=200), seed=3)
    for a, b in zip(one.state_dict().values(), two.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert [f.error_after for f in first.fits] == [f.error_after for f in second.fits]
    assert first.rows == 200
    three = _pruned(dense)
    reconstruct(dense, three, _batches(), ReconstructionOptions(max_rows=200), seed=4)
    assert not torch.equal(three.bert.encoder.layer[0].attention.output.dense.weight,
                           one.bert.encoder.layer[0].attention.output.dense.weight)


def test_too_few_calibration_rows_names_the_rows_needed() -> None:
    dense = _dense("bert")
    pruned = _pruned(dense)
    # Layer 2 keeps 3 heads of 8 dimensions: 24 weights and a bias per output.
    batches = [collate(_rows(4, 2), np.arange(2))]
    kept = {k: v.clone() for k, v in pruned.state_dict().items()}
    needs = r"needs at least 25 calibration tokens \(layer 2's attention refit"
    with pytest.raises(InvalidInputError, match=needs) as err:
        reconstruct(dense, pruned, batches)
    tokens = int(batches[0]["attention_mask"].sum())
    texts_needed = -(-25 * 2 // tokens)  # two texts gave `tokens`: at that mean length, ceil(25 / (tokens / 2))
    assert f"got {tokens} from 2 text(s)" in str(err.value), str(err.value)
    assert f"takes at least {texts_needed} texts" in str(err.value) and "`reconstruction_rows`" in str(err.value)
    assert all(torch.equal(kept[k], v) for k, v in pruned.state_dict().items())  # nothing was changed


def test_an_ill_conditioned_system_is_held_by_the_ridge_term_and_said() -> None:
    dense = _dense("bert")
    pruned = _pruned(dense)
    # One sentence many times: many rows, but only as many distinct ones as its tokens.
    rows = _rows(8, 5)
    batch = collate(rows, np.zeros(40, dtype=np.int64))
    result = reconstruct(dense, pruned, [batch])
    assert result.ill_conditioned and any("ill-conditioned" in note for note in result.notes)
    assert all(np.isfinite(p.detach().numpy()).all() for p in pruned.parameters())
    # Directions the rows never showed keep their trained weights: other sentences are not thrown off.
    held_out = _batches(64, seed=7)
    assert _layer_errors(dense, pruned, held_out)[-1] < 1.0


def test_ffn_output_projection_is_refit_over_a_subset_of_neurons() -> None:
    dense = _dense("bert")
    pruned = copy.deepcopy(dense)
    with torch.no_grad():  # keep half of each layer's intermediate neurons, as an FFN pruning would
        for layer in pruned.bert.encoder.layer:
            up, down = layer.intermediate.dense, layer.output.dense
            keep = torch.arange(0, up.out_features, 2)
            new_up = torch.nn.Linear(up.in_features, len(keep))
            new_up.weight.copy_(up.weight[keep])
            new_up.bias.copy_(up.bias[keep])
            new_down = torch.nn.Linear(len(keep), down.out_features)
            new_down.weight.copy_(down.weight[:, keep])
            new_down.bias.copy_(down.bias)
            layer.intermediate.dense, layer.output.dense = new_up, new_down
    held_out = _batches(64, seed=7)
    before = _layer_errors(dense, pruned, held_out)
    result = reconstruct(dense, pruned, _batches(), ReconstructionOptions(sublayers=("ffn",)))
    assert [f.sublayer for f in result.fits] == ["ffn"] * 3 and result.fits[0].units == 32
    assert (_layer_errors(dense, pruned, held_out) < before).all()


def test_bad_options_and_mismatched_models_are_refused_before_any_work() -> None:
    with pytest.raises(InvalidInputError, match="`sublayers` must be a non-empty tuple"):
        ReconstructionOptions(sublayers=("conv",))
    with pytest.raises(InvalidInputError, match="`alpha` must be a number > 0, got 0"):
        ReconstructionOptions(alpha=0)
    with pytest.raises(InvalidInputError, match="`method` must be one of"):
        ReconstructionOptions(method="lasso")
    with pytest.raises(InvalidInputError, match="`ffn_target` must be one of"):
        ReconstructionOptions(ffn_target="sum")
    with pytest.raises(InvalidInputError, match="same family"):
        reconstruct(_dense("bert"), _pruned(_dense("distilbert")), _batches())


@pytest.mark.slow  # an ONNX export and an int8 quantization
def test_reconstructed_weights_round_trip_through_save_load_onnx_and_int8(tmp_path: Path) -> None:
    dense = _dense("bert")
    pruned = _pruned(dense)
    reconstruct(dense, pruned, _batches())
    rows = _rows(24, 3)
    batch = collate(rows, np.arange(len(rows)))
    with torch.no_grad():
        expected = pruned(**model_inputs(pruned, batch)).logits
        save_pruned(pruned, make_tokenizer(), tmp_path / "model")
        loaded = load_pruned(tmp_path / "model").eval()
        assert torch.equal(loaded(**model_inputs(loaded, batch)).logits, expected)
    exported = export_onnx(pruned, make_tokenizer(), tmp_path / "onnx", data=rows)
    assert exported.parity is not None and exported.parity.passed
    int8 = quantize_int8(tmp_path / "onnx", tmp_path / "onnx-int8", model=pruned, parity_data=rows, eval_data=rows)
    assert int8.deviation is not None and int8.deviation.prediction_agreement >= 0.5


def test_a_model_whose_projection_is_not_linear_is_refused_with_the_reason_before_any_work() -> None:
    from cahp_engine.config import PruningConfig
    from cahp_engine.errors import UnsupportedModelError
    from cahp_engine.recovery import unsupported_reason
    from cahp_engine.run._reconstruct import RUN_RECONSTRUCTION, check_reconstruction, reconstruction_options

    dense = _dense("bert")
    pruned = _pruned(dense)
    for layer in pruned.bert.encoder.layer:  # a custom block whose FFN output is not one linear layer
        layer.output.dense = torch.nn.Sequential(layer.output.dense)
    reason = unsupported_reason(pruned, ReconstructionOptions(sublayers=("ffn",)))
    assert reason == "the bert family's ffn output projection is not a linear layer"
    kept = {k: v.clone() for k, v in pruned.state_dict().items()}
    with pytest.raises(UnsupportedModelError, match="layer-wise reconstruction cannot run: the bert family's ffn"):
        reconstruct(dense, pruned, _batches(), ReconstructionOptions(sublayers=("attention", "ffn")))
    assert all(torch.equal(kept[k], v) for k, v in pruned.state_dict().items())
    assert unsupported_reason(pruned, ReconstructionOptions()) is None  # the attention refit still can
    check_reconstruction(pruned, PruningConfig(recovery="reconstruct"))
    # A run that removed heads only refits the attention alone there (the feed-forward refit only refines).
    alone = PruningConfig(recovery="reconstruct")
    assert reconstruction_options(pruned, alone) == ReconstructionOptions()
    assert reconstruction_options(_pruned(dense), alone) == RUN_RECONSTRUCTION
    # A run that fine-tunes afterwards leaves a system short of calibration tokens as pruned instead of failing.
    assert reconstruction_options(_pruned(dense), PruningConfig()) == dataclasses.replace(RUN_RECONSTRUCTION,
                                                                                          short="skip")


def test_the_dense_targets_kept_from_one_pass_give_the_same_refit_as_a_pass_per_layer(monkeypatch) -> None:
    from cahp_engine.recovery import _reconstruction

    dense = _dense("bert")
    cached, per_layer = _pruned(dense), _pruned(dense)
    both = ReconstructionOptions(sublayers=("attention", "ffn"), ffn_target="residual")
    reconstruct(dense, cached, _batches(), both)
    monkeypatch.setattr(_reconstruction, "TARGET_CACHE_BYTES", 0)  # too small: the dense model runs per layer
    reconstruct(dense, per_layer, _batches(), both)
    for a, b in zip(cached.state_dict().values(), per_layer.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_skipping_systems_short_of_rows_leaves_them_as_pruned_refits_the_rest_and_says_so() -> None:
    # Two texts hold fewer tokens than layer 2's attention refit has unknowns (3 heads of 8 dimensions and a
    # bias); under `short` skip that system stays as pruned and is named, and the layers that fit are refit.
    dense = _dense("bert")
    pruned = _pruned(dense)
    batches = [collate(_rows(4, 2), np.arange(2))]
    tokens = int(batches[0]["attention_mask"].sum())
    unknowns = {i: layer.attention.output.dense.in_features + 1 for i, layer in enumerate(pruned.bert.encoder.layer)}
    short = sorted(i for i, n in unknowns.items() if n > tokens)
    assert short and len(short) < len(unknowns)  # some layers fit, some do not
    before = {i: pruned.bert.encoder.layer[i].attention.output.dense.weight.clone() for i in unknowns}
    result = reconstruct(dense, pruned, batches, ReconstructionOptions(short="skip"))
    assert sorted(f.layer for f in result.fits) == sorted(set(unknowns) - set(short))
    assert all(f.error_after < f.error_before for f in result.fits)
    for i in unknowns:
        unchanged = torch.equal(pruned.bert.encoder.layer[i].attention.output.dense.weight, before[i])
        assert unchanged == (i in short)
    assert [note for note in result.notes if "ill-conditioned" not in note] == [
        f"the attention refit of layer(s) {', '.join(map(str, short))} need up to {max(unknowns[i] for i in short)} "
        f"calibration tokens, got {tokens}: left as pruned for fine-tuning to recover; more calibration texts "
        f"(`reconstruction_rows`) would refit them"]
    with pytest.raises(InvalidInputError, match="`short` must be one of"):
        ReconstructionOptions(short="ignore")


def test_whole_feed_forward_blocks_short_of_rows_are_left_as_trained_and_said() -> None:
    # Three texts give more tokens than an attention refit's unknowns (at most 25) and fewer than a whole
    # feed-forward block's (64 neurons and a bias): the heads are refit, the blocks that lost nothing are
    # left as they were, and the note says why.
    dense = _dense("bert")
    pruned = _pruned(dense)
    batches = [collate(_rows(3, 2), np.arange(3))]
    tokens = int(batches[0]["attention_mask"].sum())
    assert 25 <= tokens < 65
    kept = {k: v.clone() for k, v in pruned.state_dict().items() if ".output.dense." in k and "attention" not in k}
    result = reconstruct(dense, pruned, batches, ReconstructionOptions(sublayers=("attention", "ffn"),
                                                                       ffn_target="residual"))
    assert [f.sublayer for f in result.fits] == ["attention"] * 3
    # (So few rows may also leave an attention system ill-conditioned, said in a note of its own.)
    assert [note for note in result.notes if "ill-conditioned" not in note] == [
        f"the feed-forward blocks of layer(s) 0, 1, 2 keep all their neurons and their refit needs 65 calibration "
        f"tokens, got {tokens}: left as trained"]
    state = pruned.state_dict()
    assert all(torch.equal(state[k], v) for k, v in kept.items())


@pytest.mark.parametrize("family", FAMILIES)
def test_the_layers_run_one_at_a_time_give_the_same_refit_as_passes_from_the_embeddings(family, monkeypatch) -> None:
    from cahp_engine.recovery import _passes, _reconstruction

    dense = _dense(family)
    both = ReconstructionOptions(sublayers=("attention", "ffn"), ffn_target="residual")
    seen: list[object] = []

    def spied(*args):
        seen.append(_passes.layer_calls(*args))
        return seen[-1]

    monkeypatch.setattr(_reconstruction, "layer_calls", spied)
    through: list[object] = []
    calls_of = _passes._calls_of
    monkeypatch.setattr(_passes, "_calls_of", lambda *args, **kw: through.append(kw.get("through")) or calls_of(
        *args, **kw))
    one_at_a_time = _pruned(dense)
    reconstruct(dense, one_at_a_time, _batches(), both)
    assert seen and seen[0] is not None  # this family's layers can be called one after another
    # The first batch runs the model and checks that layers handing their input back give the same calls;
    # the other three read their calls from such passes.
    assert [t is not None for t in through] == [False, True, True, True, True]
    monkeypatch.setattr(_reconstruction, "layer_calls", lambda *_args: None)
    whole_passes = _pruned(dense)
    reconstruct(dense, whole_passes, _batches(), both)
    for a, b in zip(one_at_a_time.state_dict().values(), whole_passes.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_layers_that_return_more_than_their_hidden_states_run_in_every_batch_s_pass(monkeypatch) -> None:
    # A layer that also returns a tensor beside its hidden states (as with attention weights): a layer
    # handing its input back could not imitate it, so every batch's calls come from the model's own pass,
    # and the refit is the same as from whole passes.
    from cahp_engine.recovery import _passes, _reconstruction

    dense = _dense("deberta-v2")

    def with_extra(model: torch.nn.Module) -> torch.nn.Module:
        for layer in model.deberta.encoder.layer:
            layer.register_forward_hook(lambda _m, _a, out: (out[0], out[0].sum(dim=-1)))
        return model

    through: list[object] = []
    calls_of = _passes._calls_of
    monkeypatch.setattr(_passes, "_calls_of", lambda *args, **kw: through.append(kw.get("through")) or calls_of(
        *args, **kw))
    one_at_a_time = with_extra(_pruned(dense))
    reconstruct(dense, one_at_a_time, _batches())
    assert through == [None] * 4
    monkeypatch.setattr(_reconstruction, "layer_calls", lambda *_args: None)
    whole_passes = with_extra(_pruned(dense))
    reconstruct(dense, whole_passes, _batches())
    for a, b in zip(one_at_a_time.state_dict().values(), whole_passes.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_a_family_whose_layers_cannot_run_one_at_a_time_runs_the_model_each_time(monkeypatch) -> None:
    # An encoder that does something between its layers: calling them one after another would not give its
    # hidden states, the check on the first batch sees it, and every system runs the model from its embeddings.
    from cahp_engine.recovery import _passes, _reconstruction

    dense = _dense("bert")
    pruned = _pruned(dense)
    second = pruned.bert.encoder.layer[1]
    second.register_forward_pre_hook(lambda _m, args, kwargs: ((args[0] * 1.5, *args[1:]), kwargs) if args else
                                     (args, {**kwargs, "hidden_states": kwargs["hidden_states"] * 1.5}),
                                     with_kwargs=True)
    seen: list[object] = []
    monkeypatch.setattr(_reconstruction, "layer_calls",
                        lambda *args: seen.append(_passes.layer_calls(*args)) or seen[-1])
    held_out = _batches(64, seed=7)
    before = _layer_errors(dense, pruned, held_out)
    reconstruct(dense, pruned, _batches())
    assert seen == [None]
    assert (_layer_errors(dense, pruned, held_out) < before).all()
