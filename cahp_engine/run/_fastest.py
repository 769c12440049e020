"""The fastest model within an accuracy budget: a bisection over speed targets, judged after reconstruction.

With ``max_accuracy_drop`` P and ``budget_objective`` ``speed`` the run does not look for the fewest heads
but for the highest speed-up whose model stays within P points of the dense one on the validation split:

1. **The targets**: a geometric ladder of speed-ups from x1.1 in steps of 5 % up to the most the
   allocation's cost model predicts on ``target_runtime`` (:func:`target_ladder`): the ladder's resolution.
2. **A candidate per target**: :func:`cahp_engine.allocation.prune_to_target` (the importance scored once,
   every target on the latency table the ladder was drawn from) allocates heads and feed-forward neurons
   per layer, the run's ``strategy`` picks which heads within each layer's count, the cut is measured on
   the runtime; the copy is reconstructed layer by layer and scored on the validation split, in seconds.
3. **A bisection** on that score (:func:`fastest_index`): faster targets remove more, so the score is
   assumed to fall as the target rises; a target that meets the budget moves the lower end up, one that
   misses moves the upper end down, until the fastest target within P is bracketed between two neighbours
   of the ladder. When the bracket closes on a miss, the next target above it is tried too; if it passes,
   the score was not monotone there and the bisection goes on above it (as the head-count search does
   below, :mod:`cahp_engine.run._scoring`).
4. **The chosen target's model** is the run's: the run reconstructs it (the reconstruction stage, the same
   refit that was scored) and recovers it as ``recovery`` says (``reconstruct``: no training;
   ``reconstruct+finetune``: the run's fine-tuning, keeping its best validation weights, so its
   validation score cannot end below the reconstructed one).

The search never reads the evaluation (test) split. ``budget.candidates[]`` holds every target tried, in
the order tried (``target_speedup``, ``measured_speedup``, the heads and neurons kept, the score after
reconstruction and, for the chosen one once recovered, the recovered one); ``budget.targets`` the ladder.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from torch import nn

from cahp_engine.allocation import (
    TargetResult,
    latency_costs,
    prune_to_target,
    reachable,
    serving_length,
    unit_importance,
)
from cahp_engine.data import TrainRows
from cahp_engine.errors import AccuracyBudgetError
from cahp_engine.models import current_kept_heads
from cahp_engine.recovery import TrainingResult, count_parameters
from cahp_engine.results import BudgetCandidate, BudgetRecord, ValidationPoint
from cahp_engine.run._budget import SearchSummary, budget_record, failure_message
from cahp_engine.run._candidates import SearchInputs
from cahp_engine.run._holdout import ValidationData, ValidationScorer
from cahp_engine.run._reconstruct import calibration_batches, reconstruct_pruned
from cahp_engine.run._report import RunParameters
from cahp_engine.run._target_record import ENGINE_RUNTIMES, TargetRecord
from cahp_engine.run._target_stage import TARGET_REPEATS, _as_selection, heads_within, latency_cache_dir, target_record
from cahp_engine.selection import SelectionResult

__all__ = ["FastestOutcome", "FastestScope", "fastest_index", "fastest_search", "target_ladder", "with_recovery"]

#: The ladder of speed-ups: from this one, each this much above the last.
FIRST_TARGET, TARGET_RATIO = 1.1, 1.05


def target_ladder(best: float, *, first: float = FIRST_TARGET, ratio: float = TARGET_RATIO) -> list[float]:
    """Speed-ups ``first``, ``first * ratio``, ... up to ``best`` (the reachable one, included), rounded to 0.01.

    None is above ``best``: a step rounded up past it is left out, so every target is reachable on the table
    that gave ``best``.
    """
    steps = [round(first * ratio**i, 2) for i in range(int(math.log(best / first) / math.log(ratio)) + 1)
             ] if best >= first else []
    out = [target for target in steps if target <= best]
    if not out or best - out[-1] > 0.01:
        out.append(math.floor(best * 100) / 100)
    return sorted(set(out))


def fastest_index(n: int, passes: Callable[[int], bool]) -> int | None:
    """The largest index in [0, n) where ``passes`` holds, by bisection (``passes`` assumed to hold below it).

    When the bracket closes on a miss at ``i``, ``i + 1`` is tried too; if it passes the bisection goes on
    above it. None when no index tried passes.
    """
    lo, hi, found, misses = -1, n, None, set()
    while True:
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if passes(mid):
                lo = found = mid
            else:
                hi = mid
                misses.add(mid)
        if hi + 1 >= n or hi + 1 in misses or not passes(hi + 1):
            return found
        lo = found = hi + 1  # not monotone here: search on above
        hi = min([n, *(i for i in misses if i > lo)])


@dataclass
class _TargetTried:
    target: float
    heads: int
    neurons: int
    result: TargetResult
    point: ValidationPoint
    predictions: np.ndarray
    seconds: float
    meets: bool
    order: int


@dataclass(frozen=True)
class FastestScope:
    """What the search for the fastest target reads of its run beyond what every candidate shares.

    Attributes
    ----------
    result : SelectionResult
        The selection's analysis: which heads within each layer's count (none: by importance).
    rows : TrainRows
        The training rows the cuts are calibrated and reconstructed on.
    validation : ValidationData
        The validation split they are judged on, and where it came from.
    cache_dir : str or Path, optional
        Where the latency table is read or kept (None: :func:`~cahp_engine.run._target_stage.latency_cache_dir`).
    """

    result: SelectionResult
    rows: TrainRows
    validation: ValidationData
    cache_dir: str | Path | None = None


@dataclass(frozen=True)
class FastestOutcome:
    """The chosen target's cut (not yet reconstructed), its records, and the search's budget record."""

    model: nn.Module
    parameters: RunParameters
    result: SelectionResult
    target: TargetRecord
    record: BudgetRecord


def fastest_search(inputs: SearchInputs, scope: FastestScope, *, say: Callable[[str], None] = lambda _line: None,
                   scored: Callable[[int, int], None] | None = None) -> FastestOutcome:
    """The fastest speed target within the budget, searched on reconstructed validation scores.

    ``say`` hears a line per target tried, ``scored(done, expected)`` the progress; the latency table is read
    from ``scope.cache_dir`` or measured once and kept there, and every target is cut on that one table (one
    too noisy to cache is not timed again per target, where it could say a target of the ladder is out of reach).

    Raises
    ------
    AccuracyBudgetError
        When no target meets the budget; its ``budget`` holds every target tried.
    """
    config, dense = inputs.config, inputs.dense
    result, validation = scope.result, scope.validation
    tables = scope.cache_dir or latency_cache_dir()
    started = time.perf_counter()
    batches = calibration_batches(scope.rows, config, inputs.device)
    analysis = result.analysis
    runtime = ENGINE_RUNTIMES[config.target_runtime]
    repeats = max(1, min(TARGET_REPEATS, config.latency_repeats))
    seq_len = config.target_seq_len
    length = serving_length(batches) if seq_len == "p95" else int(seq_len)
    scores = unit_importance(dense, batches, kind="fisher")
    costs = latency_costs(dense, batch_size=config.target_batch, seq_len=length, runtime=runtime,  # type: ignore[arg-type]
                          repeats=repeats, cache_dir=tables)
    targets = target_ladder(reachable(costs))
    scorer = ValidationScorer(inputs.validation, config.budget_metric, inputs.dense_validation, config.batch_size,
                              inputs.device)
    say(f"accuracy budget, the fastest model within {config.max_accuracy_drop:g} points: {len(targets)} speed targets "
        f"on {config.target_runtime} at batch {config.target_batch} x {length} tokens (x{targets[0]:g} to "
        f"x{targets[-1]:g}), judged after reconstruction; {config.budget_metric} must stay >= {inputs.threshold:.4f}")
    tried: dict[int, _TargetTried] = {}
    cuts: dict[int, nn.Module] = {}

    def pick(counts: Sequence[int]) -> Sequence[Sequence[int]]:
        assert analysis is not None
        return heads_within(analysis, config.strategy, counts, seed=config.seed)

    def passes(i: int) -> bool:
        if i not in tried:
            t0 = time.perf_counter()
            cut, target = prune_to_target(
                dense, batches, target_speedup=targets[i], batch_size=config.target_batch, seq_len=length,
                runtime=runtime, importance=scores, choose_heads=pick if analysis is not None else None,  # type: ignore[arg-type]
                repeats=repeats, costs=costs)
            cut.eval()
            judged = copy.deepcopy(cut)
            reconstruct_pruned(dense, judged, batches, config, should_cancel=inputs.should_cancel)
            point = scorer(judged, 0, 0.0)
            del judged
            entry = _TargetTried(target=targets[i], heads=sum(target.heads_per_layer),
                                 neurons=sum(target.neurons_per_layer), result=target, point=point,
                                 predictions=scorer.predictions[-1], seconds=time.perf_counter() - t0, meets=False,
                                 order=len(tried))
            entry.meets = inputs.meets(point, entry.predictions)
            tried[i] = entry
            if scored is not None:
                scored(len(tried), max(len(tried), math.ceil(math.log2(len(targets) + 1)) + 1))
            if entry.meets:
                cuts.clear()
                cuts[i] = cut
            measured = "" if target.measured_speedup is None else f", measured x{target.measured_speedup:.2f}"
            say(f"  [{len(tried)}] target x{targets[i]:g}{measured}: {entry.heads} heads, {entry.neurons} neurons; "
                f"{config.budget_metric} {point.score:.4f} after reconstruction ({entry.seconds:.1f} s)"
                + (" - within the budget" if entry.meets else ""))
        return tried[i].meets

    fastest_index(len(targets), passes)
    found = _fastest_passing(tried)
    search_s = time.perf_counter() - started
    record = _record(inputs, validation, targets, tried, search_s)
    if found is None:
        raise AccuracyBudgetError(failure_message(record), budget=record)
    chosen = tried[found]
    cut = cuts[found]  # each pass of the bisection is above the last, so the fastest passing cut is the one kept
    say(f"chosen: target x{chosen.target:g} ({chosen.heads} heads, {chosen.neurons} neurons) at "
        f"{chosen.point.score:.4f} after reconstruction; {len(tried)} of {len(targets)} targets tried")
    fixed = config.replace(target_speedup=chosen.target, max_accuracy_drop=None, budget_objective="heads")
    strategy = config.strategy if analysis is not None else "importance"
    return FastestOutcome(
        model=cut, parameters=RunParameters(dense=count_parameters(dense), pruned=count_parameters(cut)),
        result=_as_selection(result, current_kept_heads(cut), strategy),
        target=target_record(fixed, chosen.result, strategy=strategy, rows=sum(len(b["labels"]) for b in batches)),
        record=record)


def _fastest_passing(tried: dict[int, _TargetTried]) -> int | None:
    """The index of the fastest target tried that met the budget (None: none did)."""
    return max((i for i, t in tried.items() if t.meets), default=None)


def _record(inputs: SearchInputs, validation: ValidationData, targets: list[float], tried: dict[int, _TargetTried],
            search_s: float) -> BudgetRecord:
    config, found = inputs.config, _fastest_passing(tried)
    candidates = []
    for i, t in sorted(tried.items(), key=lambda item: item[1].order):
        measured = t.result.measured_speedup
        candidates.append(BudgetCandidate(
            strategy=config.strategy, k=t.heads, heads_kept=t.heads, round=t.order,
            accuracy_before=t.point.accuracy, macro_f1_before=t.point.macro_f1, accuracy_best=t.point.accuracy,
            macro_f1_best=t.point.macro_f1, epochs=0.0, curve=(t.point,), drop=inputs.drop(t.predictions),
            within_budget=t.meets, stopped="judged", seconds=t.seconds, chosen=i == found,
            reason=(f"#{t.order + 1} on the search's path: target x{t.target:g}"
                    + ("" if measured is None else f" (measured x{measured:.2f})")
                    + f", {t.neurons} neurons kept; after reconstruction only"
                    + (" (within the budget)" if t.meets else " (short of the budget)")),
            reconstructed=t.point, target_speedup=t.target, measured_speedup=measured, neurons_kept=t.neurons))
    chosen = tried.get(found) if found is not None else None
    closest = chosen or max(tried.values(), key=lambda t: t.point.score, default=None)
    record = budget_record(inputs, validation, [], SearchSummary(
        tuple(candidates), per_epoch=[], search_s=search_s, final_s=0.0,
        chosen=None if chosen is None else chosen.heads, chosen_strategy=None if chosen is None else config.strategy,
        strategy_margin=None,
        noise_half_width=None if closest is None else inputs.drop(closest.predictions).half_width))
    return dataclasses.replace(record, objective="speed", targets=tuple(targets),
                               chosen_target=None if chosen is None else chosen.target)


def with_recovery(record: BudgetRecord, recovery: TrainingResult) -> BudgetRecord:
    """``record`` with the chosen target's recovered validation score (after the run's fine-tuning)."""
    best = next((p for p in recovery.validation if p.step == recovery.best_step), None)
    if best is None or recovery.steps == 0:
        return record
    candidates = tuple(
        dataclasses.replace(c, accuracy_best=best.accuracy, macro_f1_best=best.macro_f1, epochs=recovery.epochs,
                            curve=tuple(recovery.validation), stopped="within_budget",
                            reason=c.reason + f"; chosen, then fine-tuned {recovery.epochs:g} epoch(s): best "
                                              f"{best.score:.4f} after {best.epoch:g} epoch(s)")
        if c.chosen else c for c in record.candidates)
    return dataclasses.replace(record, candidates=candidates, epochs_trained=recovery.epochs)
