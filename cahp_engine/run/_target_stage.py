"""A run pruned to a speed or FLOPs target: the allocation sizes each layer, the strategy picks its heads.

When ``config.target_speedup`` or ``config.target_flops`` is set, the run's surgery is this stage instead
of keeping the knee's selection: :func:`cahp_engine.allocation.prune_to_target` scores every head and
feed-forward neuron (Fisher) on ``config.reconstruction_rows`` training rows, costs them (a latency table
fitted once per machine and cached, or FLOPs), decides how many heads and neurons each layer keeps, and
removes the rest physically; the run's strategy (CAHP by default) decides *which* heads fill each layer's
count (:func:`heads_within`). Reconstruction and recovery then run as configured.

Before any work (:func:`check_target_reachable`, from the load step) a target beyond what the architecture's
FLOPs allow is refused with the reachable one named.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from torch import nn

from cahp_engine.allocation import TargetResult, prune_to_target
from cahp_engine.config import PruningConfig
from cahp_engine.data import TrainRows
from cahp_engine.models import current_kept_heads
from cahp_engine.recovery import count_parameters
from cahp_engine.run._reconstruct import calibration_batches
from cahp_engine.run._report import RunParameters
from cahp_engine.run._target_record import ENGINE_RUNTIMES, TargetRecord
from cahp_engine.selection import HeadAnalysis, Selection, SelectionResult, choose

if TYPE_CHECKING:
    from cahp_engine.run._steps import RunContext

#: Timed passes per latency measurement of a target run (median; the first allocation is timed in three
#: alternating rounds of them); the run's ``latency_repeats`` if fewer.
TARGET_REPEATS = 3


def latency_cache_dir() -> Path:
    """Where latency tables are cached, one per machine, model shape, runtime and serving shape:
    ``$XDG_CACHE_HOME/cahp/latency`` (``~/.cache/cahp/latency``)."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "cahp" / "latency"


def heads_within(analysis: HeadAnalysis, strategy: str, counts: Sequence[int], *, seed: int) -> list[list[int]]:
    """The heads each layer keeps, ``counts[l]`` of layer ``l``, chosen by ``strategy``.

    ``cahp``: the analysis is partitioned into K = sum(counts) clusters; heads are taken in descending
    salience, first only one per cluster (complementary heads: each cluster's most salient member
    whose layer still has room), then, where a layer's count is not filled, its most salient others.
    Any other strategy: its own choice of K heads is taken first in each layer (most salient first),
    and the layer's most salient other heads fill the rest; surplus is dropped by salience.

    Parameters
    ----------
    analysis : HeadAnalysis
        Of the dense model (salience (L, H), the MSS curve's partitions).
    strategy : str
    counts : sequence of L ints, each in [0, H]
    seed : int

    Returns
    -------
    list of L sorted lists of original head indices
    """
    layers, per_layer = analysis.shape
    salience = np.asarray(analysis.salience, dtype=np.float64).reshape(-1)
    total, size = int(sum(counts)), layers * per_layer
    if total >= size:
        return [list(range(per_layer)) for _ in range(layers)]
    k = min(max(total, 1), size - 1)
    if strategy == "cahp":
        labels = analysis.labels(k)
        preferred = np.zeros(size, dtype=bool)
    else:
        labels = None
        preferred = choose(analysis, k, strategy, count=total, seed=seed).kept_mask.reshape(-1)
    order = sorted(range(size), key=lambda n: (not preferred[n], -salience[n], n))
    room, chosen, covered = [int(c) for c in counts], [[] for _ in range(layers)], set()  # type: ignore[var-annotated]
    taken = np.zeros(size, dtype=bool)
    if labels is not None:
        for n in order:
            layer = n // per_layer
            if room[layer] > 0 and int(labels[n]) not in covered:
                covered.add(int(labels[n]))
                taken[n], room[layer] = True, room[layer] - 1
                chosen[layer].append(n % per_layer)
    for n in order:
        layer = n // per_layer
        if room[layer] > 0 and not taken[n]:
            taken[n], room[layer] = True, room[layer] - 1
            chosen[layer].append(n % per_layer)
    return [sorted(heads) for heads in chosen]


def prune_for_run(
    run: RunContext, *, model: nn.Module, result: SelectionResult, rows: TrainRows,
    cache_dir: str | Path | None = None,
) -> tuple[nn.Module, RunParameters, SelectionResult, TargetRecord]:
    """The surgery of a run with a target (:func:`has_target`): the target's allocation.

    The latency table is read from ``cache_dir`` (None: :func:`latency_cache_dir`), or measured once and
    kept there. Returns the pruned copy, its parameter counts, the selection result the report and the head map
    describe (its selection replaced by the heads the target kept) and the target's record.

    Raises
    ------
    TargetUnreachableError
        When the measured cost model cannot reach the target (its message names the best reachable).
    """
    config = run.config
    with run.monitor.stage("surgery"):
        batches = calibration_batches(rows, config, run.device)
        analysis = result.analysis

        def pick(counts: Sequence[int]) -> Sequence[Sequence[int]]:
            assert analysis is not None
            return heads_within(analysis, config.strategy, counts, seed=config.seed)

        pruned, target = prune_to_target(
            model, batches, target_speedup=config.target_speedup, target_flops=config.target_flops,
            batch_size=config.target_batch, seq_len=config.target_seq_len,
            runtime=ENGINE_RUNTIMES[config.target_runtime],  # type: ignore[arg-type]
            # Without an analysis (none to choose from) the allocation keeps its most important heads.
            choose_heads=pick if analysis is not None else None, cache_dir=cache_dir or latency_cache_dir(),
            repeats=max(1, min(TARGET_REPEATS, config.latency_repeats)),
        )
        pruned.eval()
        parameters = RunParameters(dense=count_parameters(model), pruned=count_parameters(pruned))
    strategy = config.strategy if analysis is not None else "importance"
    record = target_record(config, target, strategy=strategy, rows=sum(len(b["labels"]) for b in batches))
    run.say(record.headline())
    for line in record.layer_lines():
        run.say("  " + line)
    return pruned, parameters, _as_selection(result, current_kept_heads(pruned), strategy), record


def target_record(config: PruningConfig, target: TargetResult, *, strategy: str, rows: int) -> TargetRecord:
    """The report's record of ``target`` (what :func:`prune_to_target` returned) for a run with ``config``."""
    costs, plan = target.costs, target.allocation
    speed = config.target_speedup is not None
    return TargetRecord(
        kind="speedup" if speed else "flops",
        target=float(config.target_speedup if speed else config.target_flops),  # type: ignore[arg-type]
        runtime=config.target_runtime if speed else "analytic", batch_size=costs.batch_size, seq_len=costs.seq_len,
        heads_total=costs.num_heads, neurons_total=costs.num_neurons, heads_per_layer=target.heads_per_layer,
        neurons_per_layer=target.neurons_per_layer, head_strategy=strategy, importance="fisher",
        calibration_rows=rows, flops_kept=target.flops_pruned / target.flops_dense,
        predicted_speedup=plan.predicted_speedup, reachable_speedup=target.reachable_speedup,
        measured_speedup=target.measured_speedup,
        dense_ms=None if target.dense_seconds is None else 1000 * target.dense_seconds,
        pruned_ms=None if target.pruned_seconds is None else 1000 * target.pruned_seconds,
        corrections=target.corrections, cost_unit=costs.unit, fit_error=costs.fit_error, seconds=target.seconds,
    )


def _as_selection(result: SelectionResult, kept: Sequence[Sequence[int]], strategy: str) -> SelectionResult:
    """``result`` with its selection the heads ``kept`` per layer (no knee: the allocation set the count)."""
    shape = result.selection.kept_mask.shape
    mask = np.zeros(shape, dtype=bool)
    for layer, heads in enumerate(kept):
        mask[layer, list(heads)] = True
    count = int(mask.sum())
    kept_heads: tuple[tuple[int, int], ...] = tuple(
        (int(layer), int(head)) for layer, head in zip(*np.nonzero(mask), strict=True))
    selection = Selection(kept_mask=mask, representatives=kept_heads, layer_safety_added=(), strategy=strategy)
    return dataclasses.replace(result, selection=selection, k_star=count, knee=None)
