"""Pruning to a target the user names: "twice as fast", or "half the FLOPs".

:func:`prune_to_target` scores every head and neuron in one calibration pass, reads (or measures once)
the cost of each on the serving runtime, allocates the units each layer keeps, removes the others
physically, and times the result against the dense model in the same run.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from cahp_engine._torch import model_inputs
from cahp_engine.allocation._allocate import Allocation, allocate, reachable, validate_target
from cahp_engine.allocation._costs import CostModel, flops_costs, latency_costs
from cahp_engine.allocation._importance import ImportanceKind, UnitImportance, unit_importance
from cahp_engine.allocation._runtimes import Runtime, check_runtime, median_seconds, runner
from cahp_engine.errors import InvalidInputError
from cahp_engine.models import get_adapter, heads_per_layer, neurons_per_layer, prune_heads, prune_neurons
from cahp_engine.recovery import Reconstruction, ReconstructionOptions, reconstruct

#: A measured speed-up is accepted without a correction from the target up to this much above it (a try
#: below the target never meets it); a correction aims at the middle of that window, so that a timing's
#: noise leaves the try at or above the target.
TOLERANCE = 0.04
#: Alternating rounds timing the first allocation (:func:`time_pair`), and each correction: a correction
#: decides where to aim next, and one round costs a third of three (timing is most of a target's cost).
FIRST_ROUNDS, CORRECTION_ROUNDS = 3, 1
#: A head choice: the counts of an allocation per layer -> the original head indices each layer keeps.
HeadChoice = Callable[[Sequence[int]], Sequence[Sequence[int]]]


@dataclass(frozen=True)
class TargetResult:
    """What :func:`prune_to_target` did, and how fast the result measured.

    Attributes
    ----------
    allocation : Allocation
        The heads and neurons kept per layer, with the predicted cost and speed-up.
    heads_per_layer, neurons_per_layer : tuple of int
        Kept in each layer.
    flops_dense, flops_pruned : float
        Encoder FLOPs of one forward pass at the measured shape (:func:`flops_costs`).
    dense_seconds, pruned_seconds : float or None
        Median latency of each, timed in the same run on the cost model's runtime; None for a FLOPs target.
    measured_speedup : float or None
        ``dense_seconds / pruned_seconds``.
    reachable_speedup : float
        The most the cost model predicts an allocation can reach.
    costs : CostModel
        The cost model the allocation used.
    corrections : int
        Times the allocation was redone because the measured speed-up fell below the target or more than 4 %
        above it.
    reconstruction : Reconstruction or None
        The layer-wise refit, when one was asked for.
    seconds : float
        Wall time of the whole call (importance, costs, allocation, surgery, timing).
    """

    allocation: Allocation
    heads_per_layer: tuple[int, ...]
    neurons_per_layer: tuple[int, ...]
    flops_dense: float
    flops_pruned: float
    dense_seconds: float | None
    pruned_seconds: float | None
    measured_speedup: float | None
    reachable_speedup: float
    costs: CostModel
    corrections: int
    reconstruction: Reconstruction | None
    seconds: float

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def prune_to_target(
    model: nn.Module, batches: Sequence[dict[str, torch.Tensor]], *, target_speedup: float | None = None,
    target_flops: float | None = None, batch_size: int = 32, seq_len: int | Literal["p95"] = 64,
    runtime: Runtime = "pytorch", importance: ImportanceKind | UnitImportance = "fisher",
    choose_heads: HeadChoice | None = None, cache_dir: str | Path | None = None, repeats: int = 5, corrections: int = 3,
    clock: Callable[[], float] = time.perf_counter, reconstruction: ReconstructionOptions | None = None,
    costs: CostModel | None = None,
) -> tuple[nn.Module, TargetResult]:
    """Prune a copy of ``model`` to a speed-up or FLOPs target.

    Parameters
    ----------
    model : an unpruned supported sequence classifier (left unchanged)
    batches : calibration batches with ``labels``, as :func:`unit_importance` takes
    target_speedup : float >= 1, optional
        Predicted latency at most ``dense / target_speedup`` on ``runtime`` at ``batch_size`` x ``seq_len``.
    target_flops : float in (0, 1], optional
        Encoder FLOPs at most this fraction of the dense model's.
    batch_size : int
        The serving batch the latency is measured at.
    seq_len : int or "p95"
        The serving length, in tokens; ``"p95"`` takes the 95th percentile of the calibration rows'
        lengths (their attention masks), the length most of the data is served at.
    runtime : {"pytorch", "onnxruntime", "onnxruntime-int8"}
        The serving runtime the latency table and the measured speed-up are timed on.
    importance : {"fisher", "taylor"} or UnitImportance
        How to score the units, or scores already computed on ``model``.
    choose_heads : callable, optional
        Given the allocation's head counts per layer (L ints), the original heads each layer keeps, so
        a strategy other than importance picks which heads (the counts must match). By default the most
        important heads are kept.
    cache_dir : directory for the latency table, or None to measure it each call
    repeats : timed passes per measurement (median)
    corrections : int
        When the measured speed-up falls below ``target_speedup`` or more than 4 % above it, the allocation
        aims again at 2 % above the target (:func:`next_aim`) and is measured again (in one round of dense
        and pruned passes, the first allocation in three), at most this many times; of the tries, the least
        pruned one measured at or above the target is kept (the fastest one if none is).
    clock : callable returning seconds
    reconstruction : ReconstructionOptions, optional
        When given, the kept units' output projections are refit on ``batches`` after the surgery
        (:func:`cahp_engine.recovery.reconstruct`, retraining-free), e.g. with
        ``sublayers=("attention", "ffn")`` for heads and neurons. Shapes, and so speed, do not change.
    costs : CostModel, optional
        For a speed target, the latency table to allocate on, already fitted for this model on ``runtime`` at
        ``batch_size`` x ``seq_len`` (:func:`latency_costs`): nothing is timed for it and ``cache_dir`` is not
        read. A caller cutting several targets gives each the table it chose them from, so that a table too
        noisy to cache, timed again, does not put a target it offered out of reach.

    Returns
    -------
    (pruned model, TargetResult)

    Raises
    ------
    InvalidInputError
        On a target below 1 (speed-up) or outside (0, 1] (FLOPs), or beyond what the model reaches (a
        :class:`~cahp_engine.allocation.TargetUnreachableError` naming the best reachable), before any
        surgery; if ``costs`` is given for a FLOPs target or is not a latency table of this runtime and serving
        shape; or if ``choose_heads`` returns other counts than it was given.
    """
    start = clock()
    check_runtime(runtime)
    validate_target(target_speedup=target_speedup, target_flops=target_flops)
    seq_len = serving_length(batches) if seq_len == "p95" else seq_len
    adapter = get_adapter(model)
    adapter.feed_forward(adapter.layers(model)[0])  # a family whose neurons cannot be cut is refused here
    scores = importance if isinstance(importance, UnitImportance) else unit_importance(model, batches, kind=importance)
    flops = flops_costs(model, batch_size=batch_size, seq_len=seq_len)
    if costs is not None:
        _check_table(costs, target_flops=target_flops, batch_size=batch_size, seq_len=seq_len, runtime=runtime)
    elif target_flops is not None:
        costs = flops
    else:
        costs = latency_costs(model, batch_size=batch_size, seq_len=seq_len, runtime=runtime, repeats=repeats,
                              cache_dir=cache_dir, clock=clock)
    plan = allocate(scores, costs, target_speedup=target_speedup, target_flops=target_flops)
    pruned, heads = _cut(model, plan, choose_heads)
    dense_seconds = pruned_seconds = measured = None
    steps = 0
    if target_speedup is not None:
        goal = float(target_speedup)
        dense_seconds, pruned_seconds = time_pair(model, pruned, batch_size=batch_size, seq_len=seq_len,
                                                  runtime=runtime, repeats=repeats, rounds=FIRST_ROUNDS, clock=clock)
        tried = [_TimedCut(dense_seconds / pruned_seconds, plan, pruned, heads, dense_seconds, pruned_seconds)]
        asks, best = [goal], reachable(costs)
        # The cost model is linear; the runtime is not quite. A try meets the goal when it measures at or above
        # it; one below it, or more than TOLERANCE above it (it removed more than needed), has the allocation
        # aim again at the window's middle (:func:`next_aim`), at most ``corrections`` times, within
        # [1, reachable]; the least pruned try that meets the goal is kept.
        middle = goal * (1 + TOLERANCE / 2)
        while steps < corrections and not goal <= tried[-1].speedup <= goal * (1 + TOLERANCE):
            following = min(max(next_aim(asks, [t.speedup for t in tried], middle), 1.0), best)
            if following in asks:
                break
            steps, asked = steps + 1, following
            asks.append(asked)
            candidate = allocate(scores, costs, target_speedup=asked)
            cut, kept = _cut(model, candidate, choose_heads)
            dense_s, pruned_s = time_pair(model, cut, batch_size=batch_size, seq_len=seq_len, runtime=runtime,
                                          repeats=repeats, rounds=CORRECTION_ROUNDS, clock=clock)
            tried.append(_TimedCut(dense_s / pruned_s, candidate, cut, kept, dense_s, pruned_s))
        # A cut that removes nothing is the dense model, whatever a noisy timing says of it: it never meets a
        # goal, and is kept only when no try removed anything.
        whole = (tuple(heads_per_layer(model)), tuple(neurons_per_layer(model)))
        cutting = [t for t in tried if (tuple(t.heads), tuple(t.plan.neurons_per_layer)) != whole] or tried
        meeting = [t for t in cutting if t.speedup >= goal]
        chosen = min(meeting, key=lambda t: t.speedup) if meeting else max(cutting, key=lambda t: t.speedup)
        plan, pruned, heads = chosen.plan, chosen.model, chosen.heads
        dense_seconds, pruned_seconds, measured = chosen.dense_seconds, chosen.pruned_seconds, chosen.speedup
    neurons = plan.neurons_per_layer
    refit = None
    if reconstruction is not None:
        refit = reconstruct(model, pruned, [model_inputs(model, b) for b in batches], reconstruction)
    result = TargetResult(
        allocation=plan, heads_per_layer=heads, neurons_per_layer=neurons, flops_dense=flops.dense,
        flops_pruned=flops.predict(np.array(heads), np.array(neurons)), dense_seconds=dense_seconds,
        pruned_seconds=pruned_seconds, measured_speedup=measured, reachable_speedup=reachable(costs),
        costs=costs, corrections=steps, reconstruction=refit, seconds=clock() - start,
    )
    return pruned, result


def next_aim(asked: Sequence[float], measured: Sequence[float], middle: float) -> float:
    """The speed-up to allocate for next, so that the cut measures ``middle``.

    ``asked[i]`` was allocated for and measured ``measured[i]``. When the tries so far measured on both sides
    of ``middle``, the aim is interpolated linearly between the closest one below and the closest one above
    (a runtime that is not linear in the cost model shows in how far apart they landed); otherwise the
    last aim is scaled by the ratio it missed by.
    """
    below = [(m, a) for a, m in zip(asked, measured, strict=True) if m < middle]
    above = [(m, a) for a, m in zip(asked, measured, strict=True) if m >= middle]
    if below and above:
        (low, low_ask), (high, high_ask) = max(below), min(above)
        return low_ask + (middle - low) * (high_ask - low_ask) / (high - low)
    return asked[-1] * middle / measured[-1]


def _check_table(costs: CostModel, *, target_flops: float | None, batch_size: int, seq_len: int, runtime: str) -> None:
    """Refuse a given ``costs`` that is not a latency table of the target's runtime and serving shape."""
    if target_flops is not None:
        raise InvalidInputError("`costs` is a latency table for a `target_speedup`; a `target_flops` is counted in "
                                "FLOPs: leave `costs` out")
    given = (costs.unit, costs.runtime, costs.batch_size, costs.seq_len)
    if given != ("seconds", runtime, batch_size, seq_len):
        raise InvalidInputError(
            f"`costs` must be a latency table of {runtime} at batch {batch_size} x {seq_len} tokens (as "
            f"`latency_costs` fits it), got one in {costs.unit} of {costs.runtime} at batch {costs.batch_size} x "
            f"{costs.seq_len} tokens")


@dataclass(frozen=True)
class _TimedCut:
    """One allocation cut and timed while aiming at a speed target."""

    speedup: float
    plan: Allocation
    model: nn.Module
    heads: tuple[int, ...]
    dense_seconds: float
    pruned_seconds: float


def _cut(model: nn.Module, plan: Allocation, choose_heads: HeadChoice | None) -> tuple[nn.Module, tuple[int, ...]]:
    """A pruned copy of ``model`` keeping what ``plan`` keeps (the heads ``choose_heads`` picks, if given)."""
    kept_heads: Sequence[Sequence[int]] = plan.kept_heads
    if choose_heads is not None:
        counts = list(plan.heads_per_layer)
        kept_heads = [sorted(int(h) for h in heads) for heads in choose_heads(counts)]
        if [len(h) for h in kept_heads] != counts:
            raise InvalidInputError(f"`choose_heads` must keep {counts} heads per layer, got "
                                    f"{[len(h) for h in kept_heads]}")
    pruned = copy.deepcopy(model).eval()
    prune_heads(pruned, dict(enumerate(kept_heads)))
    prune_neurons(pruned, dict(enumerate(plan.kept_neurons)))
    return pruned, tuple(len(h) for h in kept_heads)


def serving_length(batches: Sequence[Mapping[str, torch.Tensor]], *, percentile: float = 95.0) -> int:
    """The ``percentile`` of the rows' lengths (real tokens, from ``attention_mask`` (B, T)), rounded up.

    Raises
    ------
    InvalidInputError
        If no batch carries an ``attention_mask``.
    """
    lengths = [b["attention_mask"].sum(dim=1).cpu().numpy() for b in batches if "attention_mask" in b]
    if not lengths:
        raise InvalidInputError("`seq_len=\"p95\"` needs calibration batches with an `attention_mask`")
    return max(1, int(np.ceil(np.percentile(np.concatenate(lengths), percentile))))


def time_pair(
    dense: nn.Module, pruned: nn.Module, *, batch_size: int, seq_len: int, runtime: Runtime = "pytorch",
    repeats: int = 5, rounds: int = 3, clock: Callable[[], float] = time.perf_counter,
) -> tuple[float, float]:
    """Median latency of ``dense`` and of ``pruned`` on one random batch and ``runtime``, in alternating rounds.

    Alternating the two in the same run keeps their ratio fair on a machine whose load changes. Each is
    made ready to run once (an onnxruntime session: one export each) and warmed up once, in the first round.
    """
    config: Any = dense.config
    generator = torch.Generator().manual_seed(1)
    low = int(getattr(config, "pad_token_id", 0) or 0) + 1
    ids = torch.randint(low, int(config.vocab_size), (batch_size, seq_len), generator=generator)
    ids = ids.to(next(dense.parameters()).device)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    firsts, seconds = [], []
    with runner(dense, batch, runtime) as run_dense, runner(pruned, batch, runtime) as run_pruned:
        for round_ in range(rounds):
            warmup = 1 if round_ == 0 else 0
            firsts.append(median_seconds(run_dense, repeats=repeats, warmup=warmup, clock=clock))
            seconds.append(median_seconds(run_pruned, repeats=repeats, warmup=warmup, clock=clock))
    return float(np.median(firsts)), float(np.median(seconds))
