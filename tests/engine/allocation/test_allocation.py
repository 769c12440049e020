"""Pruning to a target: unit importance, costs, the allocation search and the target's errors."""

from __future__ import annotations

import copy
import itertools
import platform
from pathlib import Path

import numpy as np
import pytest
import torch

from cahp_engine.allocation import (
    CostModel,
    TargetUnreachableError,
    UnitImportance,
    allocate,
    flops_costs,
    latency_costs,
    prune_to_target,
    unit_importance,
)
from cahp_engine.errors import InvalidInputError, PipelineError, UnsupportedModelError
from cahp_engine.models import gate_heads, gate_neurons, get_adapter, heads_per_layer, neurons_per_layer
from tests.support.tiny_models import LAYOUTS, make_classifier, make_texts, make_tokenizer

LAYERS, HEADS, HEAD_DIM = 3, 4, 8
NEURONS = 2 * HEADS * HEAD_DIM
TEXTS = ["good movie", "the plot was very boring and not fun at all", "fun", "a weak story but strong actor"]


def _model(family: str = "bert") -> torch.nn.Module:
    model = make_classifier(family, layers=LAYERS, heads=HEADS, head_dim=HEAD_DIM)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() == 2 or name.endswith(".bias"):
                parameter.normal_(0.0, 0.2, generator=generator)
    return model.eval()


def _batches() -> list[dict[str, torch.Tensor]]:
    encoded = make_tokenizer()(TEXTS, padding=True, return_tensors="pt")
    batch = {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"],
             "labels": torch.tensor([0, 1, 2, 0])}
    return [batch, {**batch, "labels": torch.tensor([2, 2, 1, 0])}]


def _costs(**overrides: float) -> CostModel:
    values = {"fixed": 10.0, "attention": 1.0, "head": 2.0, "ffn": 1.0, "neuron": 0.25, **overrides}
    return CostModel(unit="seconds", num_layers=LAYERS, num_heads=HEADS, num_neurons=NEURONS, batch_size=8,
                     seq_len=16, runtime="pytorch", **values)


@pytest.mark.parametrize("family", LAYOUTS)
def test_importance_scores_every_head_and_neuron_and_a_dead_unit_scores_zero(family: str) -> None:
    model = _model(family)
    adapter = get_adapter(model)
    with torch.no_grad():  # neuron 5 of layer 1 and head 2 of layer 0 no longer reach the output
        adapter.feed_forward(adapter.layers(model)[1]).output.weight[:, 5] = 0
        adapter.attention(adapter.layers(model)[0]).output.weight[:, 2 * HEAD_DIM:3 * HEAD_DIM] = 0
    fisher = unit_importance(model, _batches()[:1], kind="fisher")
    taylor = unit_importance(model, _batches()[:1], kind="taylor")
    assert fisher.heads.shape == (LAYERS, HEADS) and fisher.neurons.shape == (LAYERS, NEURONS)
    assert fisher.neurons[1, 5] == 0 and fisher.heads[0, 2] == 0
    assert (fisher.neurons > 0).sum() > NEURONS  # the others do matter
    # One batch: the Fisher score is the square of the Taylor score.
    torch.testing.assert_close(fisher.neurons, taylor.neurons.square())
    torch.testing.assert_close(fisher.heads, taylor.heads.square())
    assert not any(p.requires_grad is False for p in model.parameters())  # restored


def test_flops_costs_count_the_weights_each_unit_multiplies() -> None:
    model = _model("modernbert")
    costs = flops_costs(model, batch_size=2, seq_len=16)
    adapter = get_adapter(model)
    parts = [adapter.feed_forward(layer) for layer in adapter.layers(model)]
    ffn_weights = sum(p.input.weight.numel() + p.output.weight.numel() for p in parts)
    # 2 FLOPs per multiply-accumulate, one per weight and token, over 2 x 16 tokens.
    assert costs.neuron * NEURONS * LAYERS == 2 * 32 * ffn_weights
    attention_weights = sum(p.weight.numel() for layer in adapter.layers(model)
                            for p in (*adapter.attention(layer).projections, adapter.attention(layer).output))
    assert costs.head * HEADS * LAYERS == 2 * 32 * attention_weights + LAYERS * HEADS * 32 * 4 * 16 * HEAD_DIM


def test_allocation_meets_the_budget_by_the_cheapest_loss_per_cost() -> None:
    generator = torch.Generator().manual_seed(0)
    heads = torch.rand(LAYERS, HEADS, generator=generator, dtype=torch.float64) + 1.0
    neurons = torch.rand(LAYERS, NEURONS, generator=generator, dtype=torch.float64) + 1.0
    neurons[2] *= 1e-3  # layer 2's neurons barely matter: they go first
    importance = UnitImportance(heads=heads, neurons=neurons, kind="fisher", batches=1)
    costs = _costs()
    plan = allocate(importance, costs, target_speedup=1.3)
    assert plan.predicted_cost <= costs.dense / 1.3 + 1e-9 and plan.predicted_speedup >= 1.3
    assert plan.neurons_per_layer[2] == 1 and plan.neurons_per_layer[:2] != (1, 1)
    assert all(h >= 1 for h in plan.heads_per_layer) and all(n >= 1 for n in plan.neurons_per_layer)
    # The kept ones are each layer's most important.
    for layer, kept in enumerate(plan.kept_neurons):
        dropped = sorted(set(range(NEURONS)) - set(kept))
        if dropped:
            assert neurons[layer, list(kept)].min() >= neurons[layer, dropped].max()
    removed = sum(float(neurons[layer, sorted(set(range(NEURONS)) - set(kept))].sum())
                  for layer, kept in enumerate(plan.kept_neurons))
    removed += sum(float(heads[layer, sorted(set(range(HEADS)) - set(kept))].sum())
                   for layer, kept in enumerate(plan.kept_heads))
    assert plan.predicted_loss == pytest.approx(removed)
    # A FLOPs target: the same search under a fraction of the dense cost.
    half = allocate(importance, costs, target_flops=0.5)
    assert half.predicted_cost <= 0.5 * costs.dense + 1e-9


@pytest.mark.parametrize(("target", "message"), [
    ({"target_speedup": 0.5}, r"`target_speedup` must be a number >= 1, got 0.5"),
    ({"target_speedup": True}, r"`target_speedup` must be a number >= 1"),
    ({"target_flops": 1.5}, r"`target_flops` must be a fraction of the dense FLOPs in \(0, 1\], got 1.5"),
    ({}, "give exactly one of `target_speedup` and `target_flops`"),
    ({"target_speedup": 2.0, "target_flops": 0.5}, "give exactly one"),
])
def test_malformed_targets_are_refused(target: dict, message: str) -> None:
    importance = UnitImportance(heads=torch.ones(LAYERS, HEADS), neurons=torch.ones(LAYERS, NEURONS), kind="fisher",
                                batches=1)
    with pytest.raises(InvalidInputError, match=message):
        allocate(importance, _costs(), **target)


def test_an_unreachable_target_names_the_best_reachable() -> None:
    importance = UnitImportance(heads=torch.ones(LAYERS, HEADS), neurons=torch.ones(LAYERS, NEURONS), kind="fisher",
                                batches=1)
    costs = _costs()
    best = costs.dense / costs.floor
    with pytest.raises(TargetUnreachableError, match=rf"at most x{best:.2f}, keeping one head and one neuron") as info:
        allocate(importance, costs, target_speedup=best * 1.01)
    assert info.value.best == pytest.approx(best)
    plan = allocate(importance, costs, target_speedup=best)  # the best itself is reachable
    assert plan.heads_per_layer == (1,) * LAYERS and plan.neurons_per_layer == (1,) * LAYERS
    with pytest.raises(TargetUnreachableError, match="is below what this model can keep"):
        allocate(importance, costs, target_flops=0.5 / best)


class _ModelClock:
    """A controlled clock: a timed pass lasts ``fixed + per_head * heads + per_neuron * neurons`` seconds of
    the model being run, read off its shapes by a forward pre-hook, so the fit can be checked exactly."""

    def __init__(self, fixed: float, per_head: float, per_neuron: float) -> None:
        self.now, self.fixed, self.per_head, self.per_neuron = 0.0, fixed, per_head, per_neuron
        self.calls = 0

    def attach(self, model: torch.nn.Module) -> None:
        model.register_forward_pre_hook(lambda module, _args: self._advance(module))

    def _advance(self, module: torch.nn.Module) -> None:
        self.now += self.fixed + self.per_head * sum(heads_per_layer(module)) \
            + self.per_neuron * sum(neurons_per_layer(module))

    def __call__(self) -> float:
        self.calls += 1
        return self.now


def test_latency_table_is_fitted_on_the_model_once_and_read_from_its_cache(tmp_path: Path) -> None:
    model = _model()
    clock = _ModelClock(fixed=0.5, per_head=0.01, per_neuron=0.001)
    clock.attach(model)  # deep copies keep the hook: every pruned copy advances the clock by its own shape
    costs = latency_costs(model, batch_size=2, seq_len=8, repeats=2, rounds=2, cache_dir=tmp_path, clock=clock)
    assert costs.points == 8 and costs.unit == "seconds" and costs.fit_error < 1e-6
    assert (costs.fixed, costs.head, costs.neuron) == pytest.approx((0.5, 0.01, 0.001), abs=1e-9)
    assert costs.attention == pytest.approx(0.0, abs=1e-9) and costs.ffn == pytest.approx(0.0, abs=1e-9)
    assert len(list(tmp_path.glob("latency-*.json"))) == 1
    clock.calls = 0
    assert latency_costs(model, batch_size=2, seq_len=8, repeats=2, rounds=2, cache_dir=tmp_path, clock=clock) == costs
    assert clock.calls == 0  # read, not timed
    other = latency_costs(model, batch_size=4, seq_len=8, repeats=2, rounds=2, cache_dir=tmp_path, clock=clock)
    assert other.batch_size == 4 and len(list(tmp_path.glob("latency-*.json"))) == 2
    best = costs.dense / costs.floor
    with pytest.raises(TargetUnreachableError, match=rf"at most x{best:.2f}"):
        prune_to_target(model, _batches(), target_speedup=best + 0.1, batch_size=2, seq_len=8, cache_dir=tmp_path,
                        repeats=2, clock=clock)


def test_a_cached_table_is_found_again_by_a_new_container_of_the_machine_and_after_a_loss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = _model()
    clock = _ModelClock(fixed=0.5, per_head=0.01, per_neuron=0.001)
    clock.attach(model)
    costs = latency_costs(model, batch_size=2, seq_len=8, repeats=1, rounds=1, cache_dir=tmp_path, clock=clock)
    # A worker's container gets a new host name each start; the first loss computed sets `problem_type`.
    monkeypatch.setattr(platform, "node", lambda: "another-container-7f3a")
    model(**_batches()[0])
    assert model.config.problem_type is not None
    clock.calls = 0
    assert latency_costs(model, batch_size=2, seq_len=8, repeats=1, rounds=1, cache_dir=tmp_path, clock=clock) == costs
    assert clock.calls == 0


class _BusyAtFirst(_ModelClock):
    """A machine too busy to see the model for its first ``busy`` passes (each as long as the last), quiet after."""

    def __init__(self, busy: int) -> None:
        super().__init__(fixed=0.5, per_head=0.01, per_neuron=0.001)
        self.busy, self.passes = busy, 0

    def _advance(self, module: torch.nn.Module) -> None:
        self.passes += 1
        if self.passes <= self.busy:
            self.now += 1.0
        else:
            super()._advance(module)


def test_timings_buried_in_noise_are_taken_again_with_more_passes(tmp_path: Path) -> None:
    model = _model()
    first_attempt = 8 * 1 * (1 + 1)  # 8 shapes x 1 round x (1 warm-up + 1 timed pass)
    clock = _BusyAtFirst(busy=first_attempt)
    clock.attach(model)
    costs = latency_costs(model, batch_size=2, seq_len=8, repeats=1, rounds=1, cache_dir=tmp_path, clock=clock)
    assert (costs.fixed, costs.head, costs.neuron) == pytest.approx((0.5, 0.01, 0.001), abs=1e-9)
    assert clock.passes == first_attempt + 8 * 2 * (1 + 2)  # the second attempt: twice the rounds and passes


def test_timings_that_do_not_follow_the_model_are_refused(tmp_path: Path) -> None:
    ticks = itertools.count()
    with pytest.raises(PipelineError, match="did not grow with the heads and neurons"):
        latency_costs(_model(), batch_size=2, seq_len=8, repeats=2, rounds=1, cache_dir=tmp_path,
                      clock=lambda: float(next(ticks)))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("family", LAYOUTS)
def test_a_flops_target_prunes_heads_and_neurons_physically(family: str) -> None:
    model = _model(family)
    batches = _batches()
    pruned, result = prune_to_target(model, batches, target_flops=0.4, batch_size=4, seq_len=16)
    assert result.flops_pruned <= 0.4 * result.flops_dense + 1e-6
    assert tuple(heads_per_layer(pruned)) == result.heads_per_layer
    assert tuple(neurons_per_layer(pruned)) == result.neurons_per_layer
    assert sum(result.neurons_per_layer) < LAYERS * NEURONS
    assert heads_per_layer(model) == [HEADS] * LAYERS  # the original is untouched
    assert sum(p.numel() for p in pruned.parameters()) < sum(p.numel() for p in model.parameters())
    plan = result.allocation
    head_gates = [torch.tensor([float(h in kept) for h in range(HEADS)]) for kept in plan.kept_heads]
    neuron_gates = [torch.tensor([float(n in kept) for n in range(NEURONS)]) for kept in plan.kept_neurons]
    inputs = {k: v for k, v in batches[0].items() if k != "labels"}
    with torch.no_grad(), gate_heads(model, head_gates), gate_neurons(model, neuron_gates):
        gated = model(**inputs).logits
    with torch.no_grad():
        torch.testing.assert_close(pruned(**inputs).logits, gated, atol=1e-5, rtol=0)
    assert np.isfinite(result.seconds) and result.measured_speedup is None


def test_a_speed_target_reports_what_it_measured_and_a_head_choice_is_honoured() -> None:
    model = _model()
    chosen: list[list[int]] = []

    def first_heads(counts):
        chosen.append(list(counts))
        return [list(range(c)) for c in counts]

    pruned, result = prune_to_target(model, _batches(), target_speedup=1.0, batch_size=2, seq_len=8, repeats=1,
                                     choose_heads=first_heads, corrections=0)
    assert result.measured_speedup == result.dense_seconds / result.pruned_seconds
    assert chosen == [list(result.heads_per_layer)]
    with pytest.raises(InvalidInputError, match="`choose_heads` must keep"):
        prune_to_target(model, _batches(), target_flops=0.5, choose_heads=lambda counts: [[0]] * LAYERS)


def test_a_family_whose_neurons_cannot_be_cut_is_refused_before_any_work(monkeypatch) -> None:
    import dataclasses

    from cahp_engine.models import _families

    model = _model()
    monkeypatch.setitem(_families._ADAPTERS, "bert", dataclasses.replace(get_adapter(model), ffn_output_path=None))
    with pytest.raises(UnsupportedModelError, match="cannot be pruned"):
        prune_to_target(model, [], target_flops=0.5)  # no batches: it fails before it would read them


@pytest.mark.parametrize("family", LAYOUTS)
def test_reconstruction_brings_the_pruned_model_back_towards_the_dense_one(family: str) -> None:
    from cahp_engine.recovery import ReconstructionOptions

    model = _model(family)
    texts, labels = make_texts(64, seed=1)
    encoded = make_tokenizer()(texts, padding=True, return_tensors="pt")
    batches = [{"input_ids": encoded["input_ids"][i:i + 16], "attention_mask": encoded["attention_mask"][i:i + 16],
                "labels": torch.tensor(labels[i:i + 16])} for i in range(0, 64, 16)]
    inputs = {k: v for k, v in batches[0].items() if k != "labels"}
    plain, _ = prune_to_target(model, batches, target_flops=0.4, batch_size=4, seq_len=16)
    refit, result = prune_to_target(model, batches, target_flops=0.4, batch_size=4, seq_len=16,
                                    reconstruction=ReconstructionOptions(sublayers=("attention", "ffn")))
    assert neurons_per_layer(refit) == neurons_per_layer(plain)  # same shapes: the same speed
    assert result.reconstruction is not None and {f.sublayer for f in result.reconstruction.fits} == {"attention",
                                                                                                      "ffn"}
    with torch.no_grad():
        dense = model(**inputs).logits
        assert (refit(**inputs).logits - dense).abs().mean() < (plain(**inputs).logits - dense).abs().mean()


class _CurvedClock(_ModelClock):
    """A runtime that is not linear in the neurons kept: a neuron costs more the more neurons there are."""

    def _advance(self, module: torch.nn.Module) -> None:
        share = sum(neurons_per_layer(module)) / (LAYERS * NEURONS)
        self.now += self.fixed + self.per_head * sum(heads_per_layer(module)) \
            + self.per_neuron * sum(neurons_per_layer(module)) * (0.5 + share)


def test_a_measured_miss_is_corrected_and_the_least_pruned_model_meeting_the_target_kept(tmp_path: Path) -> None:
    model = _model()
    clock = _CurvedClock(fixed=0.05, per_head=0.01, per_neuron=0.004)
    clock.attach(model)
    kwargs = {"target_speedup": 2.0, "batch_size": 2, "seq_len": 8, "repeats": 1, "cache_dir": tmp_path,
              "clock": clock}
    _, once = prune_to_target(model, _batches(), corrections=0, **kwargs)
    assert once.corrections == 0
    assert abs(once.measured_speedup / 2.0 - 1) > 0.02  # the linear table misses this runtime
    pruned, fixed = prune_to_target(model, _batches(), corrections=4, **kwargs)
    assert fixed.corrections >= 1
    assert 2.0 <= fixed.measured_speedup <= 2.0 * 1.04  # at or above the target, by no more than the window
    assert abs(fixed.measured_speedup - 2.0) < abs(once.measured_speedup - 2.0)
    assert tuple(neurons_per_layer(pruned)) == fixed.neurons_per_layer


class _SlowCopyClock(_ModelClock):
    """A runtime where every copy of the model runs ``slower`` (a fraction) slower than the linear table says,
    the dense model itself exactly as it says."""

    def __init__(self, original: torch.nn.Module, slower: float, **linear: float) -> None:
        super().__init__(**linear)
        self.original, self.slower = original, slower

    def _advance(self, module: torch.nn.Module) -> None:
        before = self.now
        super()._advance(module)
        if module is not self.original:
            self.now += self.slower * (self.now - before)


def test_a_try_measured_a_hair_under_the_target_is_aimed_again_and_the_kept_one_meets_it(tmp_path: Path) -> None:
    model = _model()
    linear = {"fixed": 0.05, "per_head": 0.01, "per_neuron": 0.001}
    twin, table_clock = copy.deepcopy(model), _ModelClock(**linear)
    table_clock.attach(twin)  # the latency table is fitted on the linear runtime and cached: the target reads it
    latency_costs(twin, batch_size=2, seq_len=8, repeats=1, rounds=1, cache_dir=tmp_path, clock=table_clock)
    clock = _SlowCopyClock(model, slower=0.0, **linear)
    clock.attach(model)
    kwargs = {"target_speedup": 2.0, "batch_size": 2, "seq_len": 8, "repeats": 1, "cache_dir": tmp_path,
              "clock": clock}
    _, linear_try = prune_to_target(model, _batches(), corrections=0, **kwargs)
    # Copies slowed just enough that the allocation's own choice measures x1.99: what a 2 % tolerance accepted.
    clock.slower = linear_try.measured_speedup / 1.99 - 1
    _, once = prune_to_target(model, _batches(), corrections=0, **kwargs)
    assert once.measured_speedup == pytest.approx(1.99)
    pruned, result = prune_to_target(model, _batches(), **kwargs)  # the default corrections
    assert result.corrections >= 1
    assert result.measured_speedup >= 2.0  # a tiny model's units are coarse: it may land well above
    assert sum(heads_per_layer(pruned)) + sum(neurons_per_layer(pruned)) \
        < sum(once.heads_per_layer) + sum(once.neurons_per_layer)


def test_the_next_aim_interpolates_between_tries_on_either_side_and_otherwise_scales_the_last() -> None:
    from cahp_engine.allocation._target import next_aim

    # One try so far, 5 % short of 2.04: the aim rises by 5 %.
    assert next_aim([2.0], [2.04 / 1.05], 2.04) == pytest.approx(2.0 * 1.05)
    # A runtime steeper than the cost model: x2.0 measured x1.93 and x2.11 measured x2.20. Scaling the last
    # try would aim at x1.96, below the first try that fell short; between the two the line crosses 2.04 at
    # x2.045.
    aim = next_aim([2.0, 2.11], [1.93, 2.20], 2.04)
    assert aim == pytest.approx(2.0 + 0.11 * (2.04 - 1.93) / (2.20 - 1.93))
    assert 2.0 < aim < 2.11
    # Of several tries on each side, the closest ones to the aim are interpolated between.
    assert next_aim([1.8, 2.0, 2.3, 2.11], [1.70, 1.93, 2.50, 2.20], 2.04) == pytest.approx(aim)


class _FlatteringClock(_ModelClock):
    """A runtime whose timings flatter every copy of the model: the dense model itself takes 3 s a pass, any copy
    1 s plus 0.4 s times the share of units it keeps, so a copy that removes nothing "measures" x2.14."""

    def __init__(self, original: torch.nn.Module) -> None:
        super().__init__(fixed=0.0, per_head=0.0, per_neuron=0.0)
        self.original = original

    def _advance(self, module: torch.nn.Module) -> None:
        kept = (sum(heads_per_layer(module)) + sum(neurons_per_layer(module))) / (LAYERS * (HEADS + NEURONS))
        self.now += 3.0 if module is self.original else 1.0 + 0.4 * kept


def test_a_cut_that_removes_nothing_never_meets_a_speed_target_however_it_was_timed(tmp_path: Path) -> None:
    model = _model()
    twin, linear = copy.deepcopy(model), _ModelClock(fixed=0.05, per_head=0.01, per_neuron=0.001)
    linear.attach(twin)  # the latency table is fitted on a linear runtime and cached: the target reads it
    latency_costs(twin, batch_size=2, seq_len=8, repeats=1, rounds=1, cache_dir=tmp_path, clock=linear)
    clock = _FlatteringClock(model)
    clock.attach(model)
    # Every try overshoots, so the corrections aim lower and lower, down to a cut that keeps every unit; that
    # one times as the slowest copy meeting x2.0, yet it is the dense model.
    pruned, result = prune_to_target(model, _batches(), target_speedup=2.0, batch_size=2, seq_len=8, repeats=1,
                                     cache_dir=tmp_path, clock=clock, corrections=12)
    assert result.corrections >= 2
    total = LAYERS * (HEADS + NEURONS)
    assert sum(result.heads_per_layer) + sum(result.neurons_per_layer) < total
    assert sum(heads_per_layer(pruned)) + sum(neurons_per_layer(pruned)) < total


@pytest.mark.slow  # two ONNX exports and an int8 quantization
def test_onnx_runtimes_run_the_pruned_model_itself() -> None:
    import onnxruntime  # noqa: F401  (the runtime under test)

    from cahp_engine.allocation import runner
    from cahp_engine.models import prune_heads, prune_neurons

    model = _model("bert")
    prune_heads(model, {1: [], 2: [0, 3]})
    prune_neurons(model, {0: [1, 5, 9], 1: []})
    batch = {k: v for k, v in _batches()[0].items() if k != "labels"}
    with torch.no_grad():
        expected = model(**batch).logits.numpy()
    with runner(model, batch, "onnxruntime") as run:
        np.testing.assert_allclose(run(), expected, atol=1e-4)
    with runner(model, batch, "onnxruntime-int8") as run:
        quantized = run()
    assert quantized.shape == expected.shape and np.isfinite(quantized).all()
    assert not np.allclose(quantized, expected, atol=1e-6)  # really the int8 graph, not the fp32 one
    with pytest.raises(InvalidInputError, match="`runtime` must be one of pytorch, onnxruntime, onnxruntime-int8"):
        prune_to_target(model, _batches(), target_speedup=2.0, runtime="tensorrt")


def test_the_serving_length_can_be_the_calibration_rows_95th_percentile() -> None:
    from cahp_engine.allocation import serving_length

    masks = torch.zeros(20, 30, dtype=torch.long)
    for row in range(20):
        masks[row, : row + 1] = 1  # lengths 1..20
    assert serving_length([{"attention_mask": masks[:10]}, {"attention_mask": masks[10:]}]) == 20  # 19.05 up
    assert serving_length([{"attention_mask": masks}], percentile=50) == 11  # 10.5 up
    _, result = prune_to_target(_model(), _batches(), target_flops=0.5, seq_len="p95")
    lengths = _batches()[0]["attention_mask"].sum(dim=1).float()
    assert result.costs.seq_len == int(np.ceil(np.percentile(lengths.numpy(), 95)))
    with pytest.raises(InvalidInputError, match="needs calibration batches with an `attention_mask`"):
        serving_length([{"input_ids": masks}])


def test_a_given_latency_table_is_the_one_allocated_on_and_one_of_another_shape_is_refused(tmp_path: Path) -> None:
    model, table = _model(), _costs()
    _, result = prune_to_target(model, _batches(), target_speedup=1.5, batch_size=8, seq_len=16, costs=table,
                                cache_dir=tmp_path, repeats=1)
    assert result.costs == table and result.reachable_speedup == pytest.approx(table.dense / table.floor)
    assert list(tmp_path.iterdir()) == []  # nothing fitted, nothing cached
    with pytest.raises(InvalidInputError, match="`costs` must be a latency table of pytorch at batch 4 x 16 tokens"):
        prune_to_target(model, _batches(), target_speedup=1.5, batch_size=4, seq_len=16, costs=table)
    with pytest.raises(InvalidInputError, match="leave `costs` out"):
        prune_to_target(model, _batches(), target_flops=0.5, batch_size=8, seq_len=16, costs=table)
