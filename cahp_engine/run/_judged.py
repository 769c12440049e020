"""The accuracy budget judged after reconstruction: every candidate scored in seconds, few fine-tuned.

With ``recovery`` ``reconstruct`` or ``reconstruct+finetune`` the budget's search
(:func:`judged_search`) replaces successive halving over fine-tunings:

1. **Every candidate** of the ladder (each head count x each strategy of ``budget_strategies``) is
   pruned, reconstructed (:func:`cahp_engine.recovery.reconstruct`) and scored on the validation
   split: a forward pass per layer and one validation pass each.
2. ``reconstruct``: the fewest heads whose reconstructed score meets the budget win; nothing trains.
3. ``reconstruct+finetune``: the search predicts each head count's recovered score as its best
   reconstructed score plus a **margin** calibrated on the candidates it fine-tunes (the median of
   "recovered best minus reconstructed", 0 before any). It fine-tunes the fewest heads predicted to
   meet the budget (or, when none is, the most heads left), with a **runner-up** of the same head count
   when the two reconstructed scores are within the validation split's noise (half the 95 % interval
   of the drop); a candidate pauses as soon as it meets the budget (:mod:`cahp_engine.run._candidates`).
   A pass moves the upper end down, a miss the lower end up, and the margin is re-calibrated each
   time, until no head count between the two ends is predicted to pass. The winner's recovery goes on to
   the end of the protocol, as in :func:`cahp_engine.run._budget.search`.

The fine-tunings go to the same :class:`~cahp_engine.run._executors.CandidateExecutor` (this process or
the worker pool), and each candidate's recovery starts from its reconstructed weights
(:func:`cahp_engine.run._candidates.start_run`). ``budget.candidates[]`` holds every candidate with its
score after reconstruction (``reconstructed``) and, for those fine-tuned, after recovery; the chosen
candidate's :class:`~cahp_engine.recovery.Reconstruction` goes into the outcome (report.json's
``reconstruction``). The scoring reports its progress through ``scored(done, total)`` and one log line per
candidate, so a job's progress and log move during it.
"""

from __future__ import annotations

import copy
import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from torch import nn

from cahp_engine.errors import AccuracyBudgetError
from cahp_engine.models import prune_heads
from cahp_engine.recovery import Reconstruction, finetune
from cahp_engine.results import BudgetCandidate, BudgetRecord, ValidationPoint
from cahp_engine.run._budget import BudgetOutcome, LadderStep, budget_record, failure_message
from cahp_engine.run._candidates import CandidateResult, CandidateSpec, SearchInputs
from cahp_engine.run._executors import CandidateExecutor, InTurn, finish_candidate
from cahp_engine.run._holdout import ValidationData, ValidationScorer
from cahp_engine.run._reconstruct import calibration_batches, reconstruct_pruned
from cahp_engine.selection import Selection

__all__ = ["judged_search"]


@dataclass
class _Judged:
    """A candidate scored after reconstruction, and its fine-tuning if the search ran one."""

    strategy: str
    k: int
    selection: Selection
    step: int
    point: ValidationPoint
    predictions: np.ndarray
    seconds: float
    meets: bool
    reconstruction: Reconstruction | None = None
    spec: CandidateSpec | None = None
    last: CandidateResult | None = None
    chosen: bool = False

    def rank(self) -> tuple[bool, float]:
        point = self.point if self.last is None else self.last.best
        return (not point.lost_classes, point.score)


def judged_search(steps: list[LadderStep], inputs: SearchInputs, *, validation: ValidationData,
                  executor: CandidateExecutor | None = None,
                  say: Callable[[str], None] = lambda _line: None,
                  scored: Callable[[int, int], None] | None = None) -> BudgetOutcome:
    """Search ``steps`` for the fewest heads within the budget, judging every candidate after reconstruction.

    ``scored(done, total)`` hears each candidate scored (its progress); ``say`` a line for each.

    Raises
    ------
    AccuracyBudgetError
        When no candidate meets the budget; its ``budget`` holds every candidate's record.
    """
    config = inputs.config
    executor = executor if executor is not None else InTurn()
    started = time.perf_counter()
    say(f"accuracy budget judged after reconstruction: {len(steps)} head counts "
        f"({', '.join(str(s.heads) for s in steps)}) x strategies {', '.join(config.budget_strategies)}; "
        f"{config.budget_metric} must stay >= {inputs.threshold:.4f} with no class lost")
    judged = _score_all(steps, inputs, say, scored)
    best_at = {i: max((j for j in judged if j.step == i), key=_Judged.rank) for i in range(len(steps))}
    if config.recovery == "reconstruct":
        passing = [i for i in sorted(best_at) if best_at[i].meets]
        search_s = time.perf_counter() - started
        if not passing:
            record = _record(inputs, validation, steps, judged, search_s, 0.0)
            raise AccuracyBudgetError(failure_message(record), budget=record)
        winner = best_at[passing[0]]
        winner.chosen = True
        model = _rebuild(winner, inputs)
        recovery = finetune(model, inputs.train, epochs=0.0, lr=config.lr, batch_size=config.batch_size,
                            warmup_ratio=config.warmup_ratio, weight_decay=config.weight_decay,
                            max_grad_norm=config.max_grad_norm, seed=config.seed, device=inputs.device)
        say(f"chosen: {winner.selection.num_kept} heads ({winner.strategy}, k={winner.k}) at {winner.point.score:.4f} "
            "after reconstruction; no fine-tuning (recovery reconstruct)")
        return BudgetOutcome(selection=winner.selection, k=winner.k, model=model, recovery=recovery,
                             record=_record(inputs, validation, steps, judged, search_s, 0.0),
                             reconstruction=winner.reconstruction)
    winner_or_none = _fine_tune_probes(steps, best_at, judged, inputs, executor, say)
    search_s = time.perf_counter() - started
    if winner_or_none is None:
        record = _record(inputs, validation, steps, judged, search_s, 0.0)
        raise AccuracyBudgetError(failure_message(record), budget=record)
    winner = winner_or_none
    winner.chosen = True
    assert winner.spec is not None
    say(f"chosen: {winner.selection.num_kept} heads ({winner.strategy}, k={winner.k}); its recovery goes on to the "
        "end of the protocol")
    t0 = time.perf_counter()
    finishing = dataclasses.replace(winner.spec, until_epochs=float(config.epochs), finish=True)
    winner.last, model, recovery = finish_candidate(finishing, winner.spec, inputs, executor)
    final_s = time.perf_counter() - t0
    return BudgetOutcome(selection=winner.selection, k=winner.k, model=model, recovery=recovery,
                         record=_record(inputs, validation, steps, judged, search_s, final_s),
                         reconstruction=winner.reconstruction)


def _score_all(steps: list[LadderStep], inputs: SearchInputs, say: Callable[[str], None],
               scored: Callable[[int, int], None] | None = None) -> list[_Judged]:
    """Every candidate pruned, reconstructed and scored on the validation split, fewest heads first."""
    config = inputs.config
    started = time.perf_counter()
    batches = calibration_batches(inputs.train, config, inputs.device)
    scorer = ValidationScorer(inputs.validation, config.budget_metric, inputs.dense_validation, config.batch_size,
                              inputs.device)
    total = sum(len(step.options) for step in steps)
    say(f"scoring {total} candidates after reconstruction on {len(inputs.validation)} validation rows")
    if scored is not None:
        scored(0, total)
    out: list[_Judged] = []
    for i, step in enumerate(steps):
        for name, selection in step.options:
            t0 = time.perf_counter()
            model = copy.deepcopy(inputs.dense)
            prune_heads(model, selection.kept)
            model.eval()
            rebuilt = reconstruct_pruned(inputs.dense, model, batches, config, should_cancel=inputs.should_cancel)
            point = scorer(model, 0, 0.0)
            predictions = scorer.predictions[-1]
            entry = _Judged(strategy=name, k=step.k, selection=selection, step=i, point=point,
                            predictions=predictions, seconds=time.perf_counter() - t0,
                            meets=inputs.meets(point, predictions), reconstruction=rebuilt)
            out.append(entry)
            say(f"  [{len(out)}/{total}] {name} at {selection.num_kept} heads: {config.budget_metric} "
                f"{point.score:.4f} after reconstruction ({entry.seconds:.1f} s)"
                f"{' - within the budget' if entry.meets else ''}")
            if scored is not None:
                scored(len(out), total)
    say(f"{total} candidates scored after reconstruction in {time.perf_counter() - started:.1f} s")
    return out


def _fine_tune_probes(steps: list[LadderStep], best_at: dict[int, _Judged], judged: list[_Judged],
                      inputs: SearchInputs, executor: CandidateExecutor,
                      say: Callable[[str], None]) -> _Judged | None:
    """Fine-tune the head counts the calibrated margin predicts, narrowing (lo, hi); the winner or None."""
    config = inputs.config
    margins: list[float] = []
    lo, hi, winner = -1, len(steps), None
    while hi - lo > 1:
        margin = statistics.median(margins) if margins else 0.0
        predicted = [i for i in range(lo + 1, hi) if best_at[i].point.score + margin >= inputs.threshold]
        if not predicted and winner is not None:
            break
        i = predicted[0] if predicted else hi - 1
        probe = _with_runner_up(best_at[i], [j for j in judged if j.step == i], inputs)
        say(f"fine-tuning {len(probe)} candidate(s) at {steps[i].heads} heads (margin {100 * margin:+.2f} points: "
            f"predicted {100 * (best_at[i].point.score + margin):.2f} against {100 * inputs.threshold:.2f})")
        for entry in probe:
            entry.spec = CandidateSpec(strategy=entry.strategy, k=entry.k, seed=config.seed,
                                       until_epochs=float(config.epochs),
                                       kept={layer: tuple(h) for layer, h in entry.selection.kept.items()})
        results = executor.run([e.spec for e in probe if e.spec is not None], inputs)
        for entry, result in zip(probe, results, strict=True):
            entry.last = result
            margins.append(result.best.score - entry.point.score)
            say(f"  {entry.strategy} at {entry.selection.num_kept} heads: best {result.best.score:.4f} after "
                f"{result.epochs:g} epoch(s) (reconstructed {entry.point.score:.4f}): {result.reason}")
        met = [e for e in probe if e.last is not None and e.last.status == "within_budget"]
        if met:
            best = max(met, key=_Judged.rank)
            if winner is not None and winner.spec is not None:
                executor.release(winner.spec)
            winner, hi = best, i
            for entry in probe:
                if entry is not best and entry.spec is not None:
                    executor.release(entry.spec)
        else:
            lo = i
            for entry in probe:
                if entry.spec is not None:
                    executor.release(entry.spec)
    return winner


def _with_runner_up(best: _Judged, group: list[_Judged], inputs: SearchInputs) -> list[_Judged]:
    """``best``, and the next candidate of its head count when their scores are within the split's noise."""
    others = sorted((j for j in group if j is not best), key=_Judged.rank, reverse=True)
    if not others:
        return [best]
    noise = inputs.drop(best.predictions).half_width
    return [best, others[0]] if 100.0 * (best.point.score - others[0].point.score) <= noise else [best]


def _rebuild(entry: _Judged, inputs: SearchInputs) -> nn.Module:
    """The candidate's reconstructed model again (the scoring pass does not keep every model)."""
    model = copy.deepcopy(inputs.dense)
    prune_heads(model, entry.selection.kept)
    model.eval()
    reconstruct_pruned(inputs.dense, model, calibration_batches(inputs.train, inputs.config, inputs.device),
                       inputs.config)
    return model


def _candidate(entry: _Judged, inputs: SearchInputs) -> BudgetCandidate:
    last = entry.last
    if last is None:
        point = entry.point
        return BudgetCandidate(
            strategy=entry.strategy, k=entry.k, heads_kept=entry.selection.num_kept, round=0,
            accuracy_before=point.accuracy, macro_f1_before=point.macro_f1, accuracy_best=point.accuracy,
            macro_f1_best=point.macro_f1, epochs=0.0, curve=(point,), drop=inputs.drop(entry.predictions),
            within_budget=entry.meets, stopped="judged", seconds=entry.seconds, chosen=entry.chosen,
            reason="scored after reconstruction only" + (" (within the budget)" if entry.meets else ""),
            reconstructed=point)
    return BudgetCandidate(
        strategy=entry.strategy, k=entry.k, heads_kept=entry.selection.num_kept, round=1,
        accuracy_before=last.curve[0].accuracy, macro_f1_before=last.curve[0].macro_f1,
        accuracy_best=last.best.accuracy, macro_f1_best=last.best.macro_f1, epochs=last.epochs, curve=last.curve,
        drop=last.drop, within_budget=last.status == "within_budget" or entry.chosen, stopped=last.status,
        reason=last.reason, seconds=entry.seconds + last.seconds, chosen=entry.chosen, reconstructed=entry.point)


def _record(inputs: SearchInputs, validation: ValidationData, steps: list[LadderStep], judged: list[_Judged],
            search_s: float, final_s: float) -> BudgetRecord:
    candidates = tuple(_candidate(j, inputs) for j in judged)
    chosen = next((j for j in judged if j.chosen), None)
    closest = chosen or max(judged, key=_Judged.rank, default=None)
    per_epoch = [j.last.seconds / j.last.epochs for j in judged if j.last is not None and j.last.epochs > 0]
    return budget_record(
        inputs, validation, steps, candidates, per_epoch=per_epoch, search_s=search_s, final_s=final_s,
        chosen=None if chosen is None else chosen.selection.num_kept,
        chosen_strategy=None if chosen is None else chosen.strategy, strategy_margin=None,
        noise_half_width=None if closest is None else inputs.drop(closest.predictions).half_width)
