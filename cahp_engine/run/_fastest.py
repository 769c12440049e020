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
4. **What fine-tuning adds** (``recovery`` ``reconstruct+finetune`` only; :func:`lifted_index`): where
   fine-tuning lifts the validation score, the reconstructed score understates a model that will be fine-tuned
   (on MNLI a pruned candidate gained 2.1 points in one epoch; on SST-5's validation split an epoch gained
   nothing measurable), so the search probes faster targets with ``budget_screen_epochs`` of fine-tuning from
   their reconstructed weights, each pausing once it meets the budget. The first probe is the target just
   above the fastest one that passed; its gain over its reconstructed score (the **margin**, the median of the
   probes' gains) then predicts which faster targets would pass, and the fastest target predicted to pass is
   probed next (a bisection on reconstructed scores within the bracket, scoring those it needs). A pass moves
   the lower end up, a miss the upper end down, until no target between them is predicted to pass; a probe
   that did not pass costs its epoch and nothing more, and none is run when the fastest target already passed.
5. **The chosen target's model** is the run's: the run reconstructs it (the reconstruction stage, the same
   refit that was scored) and recovers it as ``recovery`` says (``reconstruct``: no training;
   ``reconstruct+finetune``: the run's fine-tuning from the reconstructed weights, the whole protocol
   again, keeping its best validation weights, so its validation score cannot end below the reconstructed
   one).

The search never reads the evaluation (test) split. ``budget.candidates[]`` holds every target tried, in
the order tried (``target_speedup``, ``measured_speedup``, the heads and neurons kept, the score after
reconstruction, a probe's fine-tuning curve and, for the chosen one once recovered, the recovered one);
``budget.targets`` the ladder; ``budget.epochs_trained`` the probes' epochs and the final recovery's.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import statistics
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
from cahp_engine.run._candidates import CandidateResult, CandidateSpec, SearchInputs, begin_run, recover_candidate
from cahp_engine.run._holdout import ValidationData, ValidationScorer
from cahp_engine.run._reconstruct import calibration_batches, finetunes, reconstruct_pruned
from cahp_engine.run._report import RunParameters
from cahp_engine.run._target_record import ENGINE_RUNTIMES, TargetRecord
from cahp_engine.run._target_stage import TARGET_REPEATS, _as_selection, heads_within, latency_cache_dir, target_record
from cahp_engine.selection import SelectionResult

__all__ = ["FastestOutcome", "FastestScope", "fastest_index", "fastest_search", "lifted_index", "target_ladder",
           "with_recovery"]

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


def lifted_index(n: int, found: int | None, predicted: Callable[[int, float], bool],
                 probe: Callable[[int, float | None], tuple[bool, float | None]]) -> int | None:
    """The fastest index in [0, n) whose fine-tuning probe (or reconstructed score) meets the budget.

    ``found``: the fastest index that passed after reconstruction (None: none did). ``predicted(i, margin)``:
    whether index ``i``'s reconstructed score plus ``margin`` meets the budget (scoring ``i`` if it must).
    ``probe(i, margin)``: fine-tunes ``i`` briefly (``margin``: the one that predicted it, None for the first
    probe); whether it met the budget, and what fine-tuning added to its reconstructed score (None when it did
    not train: it met the budget before). The first probe is the index
    just above ``found``; later ones the fastest index predicted to pass with the median of the gains so far,
    until no index between the last pass and the slowest miss is predicted to pass.
    """
    lo, hi = (-1 if found is None else found), n
    gains: list[float] = []
    while hi - lo > 1:
        margin = statistics.median(gains) if gains else None
        if margin is not None:
            k = fastest_index(hi - lo - 1, _offset(predicted, lo + 1, margin))
            if k is None:
                break
            i = lo + 1 + k
        else:
            i = lo + 1  # no probe trained yet: the next target up measures what fine-tuning adds
        met, gain = probe(i, margin)
        if gain is not None:
            gains.append(gain)
        lo, hi = (i, hi) if met else (lo, i)
    return None if lo < 0 else lo


def _offset(predicted: Callable[[int, float], bool], first: int, margin: float) -> Callable[[int], bool]:
    """``predicted`` at ``margin`` for the indices from ``first`` on, as 0, 1, ..."""
    return lambda j: predicted(first + j, margin)


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
    probe: CandidateResult | None = None  # its fine-tuning probe, when the search ran one

    @property
    def passes(self) -> bool:
        """Met the budget after reconstruction, or after its probe's fine-tuning."""
        return self.meets or (self.probe is not None and self.probe.status == "within_budget")


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
                   progress: Callable[[float], None] | None = None) -> FastestOutcome:
    """The fastest speed target within the budget, searched on reconstructed validation scores (and, when the
    run fine-tunes, on probes of what fine-tuning adds).

    ``say`` hears a line per target tried and per probe, ``progress`` the share of the search done (it only
    rises); the latency table is read from ``scope.cache_dir`` or measured once and kept there, and every
    target is cut on that one table (one too noisy to cache is not timed again per target, where it could say
    a target of the ladder is out of reach).

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
    lifts = finetunes(config) and float(config.epochs) > 0  # what fine-tuning adds is probed (the module's step 4)
    probing = False
    scoring, shown = (0.3 if lifts else 1.0), [0.0]  # the scoring's share of the progress bar; the last share shown

    def moved(share: float) -> None:
        if progress is not None and share > shown[0]:
            shown[0] = min(0.99, share)
            progress(shown[0])

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
            moved(scoring * len(tried) / max(len(tried) + 1, math.ceil(math.log2(len(targets) + 1)) + 1))
            if entry.meets or lifts:  # a miss may still be probed when fine-tuning follows
                cuts[i] = cut
            if entry.meets and not probing:  # while probes run, only a probe's answer lets a cut go
                _let_go_below(cuts, i)
            measured = "" if target.measured_speedup is None else f", measured x{target.measured_speedup:.2f}"
            say(f"  [{len(tried)}] target x{targets[i]:g}{measured}: {entry.heads} heads, {entry.neurons} neurons; "
                f"{config.budget_metric} {point.score:.4f} after reconstruction ({entry.seconds:.1f} s)"
                + (" - within the budget" if entry.meets else ""))
        return tried[i].meets

    fastest_index(len(targets), passes)
    if lifts:
        probing = True
        screen = min(float(config.epochs), float(config.budget_screen_epochs))

        def predicted(i: int, margin: float) -> bool:
            passes(i)
            return tried[i].meets or tried[i].point.score + margin >= inputs.threshold

        def probe(i: int, margin: float | None) -> tuple[bool, float | None]:
            passes(i)
            entry = tried[i]
            say(f"fine-tuning target x{entry.target:g} ({entry.heads} heads, {entry.neurons} neurons) for up to "
                f"{screen:g} epoch(s) from its reconstructed weights, to measure what fine-tuning adds"
                if margin is None else
                f"fine-tuning target x{entry.target:g} for up to {screen:g} epoch(s) (margin {100 * margin:+.2f} "
                f"points: predicted {100 * (entry.point.score + margin):.2f} against {100 * inputs.threshold:.2f})")
            probes = sum(1 for t in tried.values() if t.probe is not None)

            def trained(step: int, total: int) -> None:  # about two probes expected; each moves the rest of the bar
                part = min(1.0, step / max(1, total) * float(config.epochs) / screen)
                moved(scoring + (1.0 - scoring) * (probes + part) / max(2, probes + 1.5))

            entry.probe = _probe(cuts[i], inputs, batches, screen, progress=trained)
            entry.seconds += entry.probe.seconds
            result = entry.probe
            say(f"  target x{entry.target:g}: best {result.best.score:.4f} after {result.epochs:g} epoch(s) "
                f"(reconstructed {entry.point.score:.4f}): {result.reason}")
            if result.status != "within_budget":
                del cuts[i]
            else:
                _let_go_below(cuts, i)
            return result.status == "within_budget", (result.best.score - entry.point.score
                                                      if result.epochs > 0 else None)

        lifted_index(len(targets), _fastest_passing(tried), predicted, probe)
    found = _fastest_passing(tried)
    search_s = time.perf_counter() - started
    record = _record(inputs, validation, targets, tried, search_s)
    if found is None:
        raise AccuracyBudgetError(failure_message(record), budget=record)
    chosen = tried[found]
    cut = cuts[found]  # every cut slower than a pass is let go, so the fastest passing cut is the one kept
    probed = "" if chosen.probe is None else (f", {chosen.probe.best.score:.4f} after {chosen.probe.epochs:g} "
                                               "epoch(s) of its probe")
    say(f"chosen: target x{chosen.target:g} ({chosen.heads} heads, {chosen.neurons} neurons) at "
        f"{chosen.point.score:.4f} after reconstruction{probed}; {len(tried)} of {len(targets)} targets tried, "
        f"{sum(1 for t in tried.values() if t.probe is not None)} fine-tuned")
    fixed = config.replace(target_speedup=chosen.target, max_accuracy_drop=None, budget_objective="heads")
    strategy = config.strategy if analysis is not None else "importance"
    return FastestOutcome(
        model=cut, parameters=RunParameters(dense=count_parameters(dense), pruned=count_parameters(cut)),
        result=_as_selection(result, current_kept_heads(cut), strategy),
        target=target_record(fixed, chosen.result, strategy=strategy, rows=sum(len(b["labels"]) for b in batches)),
        record=record)


def _fastest_passing(tried: dict[int, _TargetTried]) -> int | None:
    """The index of the fastest target tried that met the budget (None: none did)."""
    return max((i for i, t in tried.items() if t.passes), default=None)


def _let_go_below(cuts: dict[int, nn.Module], i: int) -> None:
    """Let go of every cut slower than target ``i``, which passed: none of them is chosen or probed now."""
    for slower in [j for j in cuts if j < i]:
        del cuts[slower]


def _probe(cut: nn.Module, inputs: SearchInputs, batches: list, until: float, *,
           progress: Callable[[int, int], None] | None) -> CandidateResult:
    """``cut`` reconstructed (on a copy) and fine-tuned as the run's recovery would, for up to ``until`` epochs,
    pausing once it meets the budget; its model is let go."""
    config = inputs.config
    model = copy.deepcopy(cut)
    reconstruct_pruned(inputs.dense, model, batches, config, should_cancel=inputs.should_cancel)
    kept = current_kept_heads(model)
    spec = CandidateSpec(strategy=config.strategy, k=sum(len(h) for h in kept), seed=config.seed, until_epochs=until,
                         kept={layer: tuple(heads) for layer, heads in enumerate(kept)})
    begun = begin_run(model, dataclasses.replace(inputs, progress=progress), seed=config.seed)
    return dataclasses.replace(recover_candidate(spec, inputs, resume=begun), run=None)


def _record(inputs: SearchInputs, validation: ValidationData, targets: list[float], tried: dict[int, _TargetTried],
            search_s: float) -> BudgetRecord:
    config, found = inputs.config, _fastest_passing(tried)
    candidates: list[BudgetCandidate] = []
    for i, t in sorted(tried.items(), key=lambda item: item[1].order):
        measured = t.result.measured_speedup
        path = (f"#{t.order + 1} on the search's path: target x{t.target:g}"
                + ("" if measured is None else f" (measured x{measured:.2f})") + f", {t.neurons} neurons kept")
        judged = BudgetCandidate(
            strategy=config.strategy, k=t.heads, heads_kept=t.heads, round=t.order,
            accuracy_before=t.point.accuracy, macro_f1_before=t.point.macro_f1, accuracy_best=t.point.accuracy,
            macro_f1_best=t.point.macro_f1, epochs=0.0, curve=(t.point,), drop=inputs.drop(t.predictions),
            within_budget=t.meets, stopped="judged", seconds=t.seconds, chosen=i == found,
            reason=path + "; after reconstruction only" + (" (within the budget)" if t.meets
                                                            else " (short of the budget)"),
            reconstructed=t.point, target_speedup=t.target, measured_speedup=measured, neurons_kept=t.neurons)
        probe = t.probe
        candidates.append(judged if probe is None else dataclasses.replace(
            judged, accuracy_before=probe.curve[0].accuracy, macro_f1_before=probe.curve[0].macro_f1,
            accuracy_best=probe.best.accuracy, macro_f1_best=probe.best.macro_f1, epochs=probe.epochs,
            curve=probe.curve, drop=probe.drop, within_budget=t.passes, stopped=probe.status,
            reason=path + f"; reconstructed {t.point.score:.4f}, then fine-tuned to measure what fine-tuning adds: "
                          + probe.reason))
    chosen = tried.get(found) if found is not None else None
    closest = chosen or max(tried.values(), key=lambda t: t.point.score, default=None)
    per_epoch = [t.probe.seconds / t.probe.epochs for t in tried.values() if t.probe is not None and t.probe.epochs > 0]
    record = budget_record(inputs, validation, [], SearchSummary(
        tuple(candidates), per_epoch=per_epoch, search_s=search_s, final_s=0.0,
        chosen=None if chosen is None else chosen.heads, chosen_strategy=None if chosen is None else config.strategy,
        strategy_margin=None,
        noise_half_width=None if closest is None else inputs.drop(closest.predictions).half_width))
    return dataclasses.replace(record, objective="speed", targets=tuple(targets),
                               chosen_target=None if chosen is None else chosen.target)


def with_recovery(record: BudgetRecord, recovery: TrainingResult) -> BudgetRecord:
    """``record`` with the chosen target's recovered validation score (after the run's fine-tuning), the epochs
    of the probes and of that recovery, and what the search and the recovery cost against the recovery alone
    (one run's)."""
    best = next((p for p in recovery.validation if p.step == recovery.best_step), None)
    if best is None or recovery.steps == 0:
        return record
    candidates = tuple(
        dataclasses.replace(c, accuracy_best=best.accuracy, macro_f1_best=best.macro_f1, epochs=recovery.epochs,
                            curve=tuple(recovery.validation), stopped="within_budget",
                            reason=c.reason + f"; chosen, then fine-tuned {recovery.epochs:g} epoch(s)"
                                   + (" from its reconstructed weights again" if c.epochs > 0 else "")
                                   + f": best {best.score:.4f} after {best.epoch:g} epoch(s)")
        if c.chosen else c for c in record.candidates)
    single = recovery.wall_s
    return dataclasses.replace(
        record, candidates=candidates, epochs_trained=record.epochs_trained + recovery.epochs,
        final_recovery_seconds=single,
        cost_vs_single_run=(record.search_seconds + single) / single if single > 0 else None)
