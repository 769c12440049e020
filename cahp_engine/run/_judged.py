"""The accuracy budget judged after reconstruction: few candidates scored in seconds each, fewer fine-tuned.

With ``budget_search`` ``judged`` (``auto``, the default, when ``recovery`` is ``reconstruct`` or
``reconstruct+finetune``) the budget's search (:func:`judged_search`) replaces successive halving over
fine-tunings:

1. **Candidates scored on demand** (:class:`cahp_engine.run._scoring.LazyScores`): a candidate (a head
   count x a strategy of ``budget_strategies``) is pruned, reconstructed
   (:func:`cahp_engine.recovery.reconstruct`) and scored on the validation split only when the search
   asks for it. The search bisects each strategy's ladder on that score (it assumes the score rises,
   roughly, with the head count; :mod:`cahp_engine.run._scoring` says what it does where it does not),
   so it scores about log2(steps + 1) + 1 candidates a strategy instead of every one. Each score is kept
   in the run's resume state (``budget_scores``): a resumed run scores none of them again.
2. ``recovery`` ``reconstruct``: the fewest heads whose reconstructed score meets the budget win; nothing
   trains.
3. Otherwise probes are fine-tuned, each pausing as soon as it meets the budget
   (:mod:`cahp_engine.run._candidates`). **The knee's head count goes first**, for the whole protocol
   (``epochs``): the best candidate there (by reconstructed score) is what a single run would keep, so
   when the knee is the answer the budget costs that run and the scoring, and the margin is calibrated on
   a whole recovery. Every later probe trains ``budget_screen_epochs`` at most and is the fewest heads predicted to
   meet the budget, its reconstructed score plus a **margin** calibrated on the probes so far (the median
   of "fine-tuned best minus reconstructed"), or, when none is, the most heads left. A pass moves the
   upper end down, a miss the lower end up, until no head count between the two ends is predicted to pass.
   A **runner-up** of the same head count is probed only when the best missed and the two reconstructed
   scores are within the validation split's noise (half the 95 % interval of the drop). The winner's
   recovery goes on from its probe to the end of the protocol, as in :func:`cahp_engine.run._budget.search`.

The fine-tunings go to the same :class:`~cahp_engine.run._executors.CandidateExecutor` (this process or
the worker pool); each starts from the weights ``recovery`` gives it: the reconstructed ones
(``reconstruct+finetune``) or the pruned ones (``finetune``: the reconstruction only judges)
(:func:`cahp_engine.run._candidates.start_run`). ``budget.candidates[]`` holds every candidate scored, in
the order scored (the search's path, ``round``), with its score after reconstruction (``reconstructed``)
and, for those fine-tuned, after recovery; ``budget.skipped[]`` every candidate of the ladder the search
passed by, with why. With a reconstructing recovery the chosen candidate's
:class:`~cahp_engine.recovery.Reconstruction` goes into the outcome (report.json's ``reconstruction``).
The scoring reports its progress through ``scored(done, expected)`` and one log line per candidate, so a
job's progress and log move during it.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable

from cahp_engine.errors import AccuracyBudgetError
from cahp_engine.recovery import Reconstruction, finetune
from cahp_engine.results import BudgetCandidate, BudgetRecord
from cahp_engine.run._budget import BudgetOutcome, SearchSummary, budget_record, failure_message
from cahp_engine.run._candidates import CandidateSpec, SearchInputs
from cahp_engine.run._executors import CandidateExecutor, InTurn, finish_candidate
from cahp_engine.run._holdout import ValidationData
from cahp_engine.run._reconstruct import reconstructs
from cahp_engine.run._scoring import Judged, LazyScores, every_step, rebuild
from cahp_engine.run._stage_training import run_recipe

__all__ = ["judged_search"]


def judged_search(lazy: LazyScores, *, validation: ValidationData,
                  executor: CandidateExecutor | None = None) -> BudgetOutcome:
    """Search ``lazy``'s ladder for the fewest heads within the budget, judging candidates after reconstruction.

    ``lazy`` holds the ladder, the search's inputs, its log (``say``), its progress (``scored(done,
    expected)``, each candidate scored) and its resume book, which keeps the scores for a resumed run.

    Raises
    ------
    AccuracyBudgetError
        When no candidate meets the budget; its ``budget`` holds every candidate's record.
    """
    steps, inputs, say = lazy.steps, lazy.inputs, lazy.say
    config = inputs.config
    executor = executor if executor is not None else InTurn()
    started = time.perf_counter()
    say(f"accuracy budget judged after reconstruction: {len(steps)} head counts "
        f"({', '.join(str(s.heads) for s in steps)}) x strategies {', '.join(config.budget_strategies)}; "
        f"{config.budget_metric} must stay >= {inputs.threshold:.4f} with no class lost")
    say(f"scoring about {lazy.expected} of the ladder's {every_step(steps)} candidates after reconstruction on "
        f"{len(inputs.validation)} validation rows (a bisection per strategy)")
    if config.recovery == "reconstruct":
        found = lazy.first(-1, len(steps), lambda j: j.meets, why=", short of the budget")
        search_s = time.perf_counter() - started
        if found is None:
            record = _record(validation, lazy, None, (search_s, 0.0))
            raise AccuracyBudgetError(failure_message(record), budget=record)
        winner = max((j for j in lazy.group(found) if j.meets), key=Judged.rank)
        winner.chosen = True
        model, rebuilt = rebuild(winner.selection, inputs)
        recovery = finetune(model, inputs.train, dataclasses.replace(run_recipe(config, inputs.device), epochs=0.0))
        search_s = time.perf_counter() - started
        say(f"chosen: {winner.selection.num_kept} heads ({winner.strategy}, k={winner.k}) at {winner.point.score:.4f} "
            f"after reconstruction; no fine-tuning (recovery reconstruct); {len(lazy.path)} of "
            f"{every_step(steps)} candidates scored")
        return BudgetOutcome(selection=winner.selection, k=winner.k, model=model, recovery=recovery,
                             record=_record(validation, lazy, found, (search_s, 0.0)),
                             reconstruction=rebuilt)
    found_or_none = _fine_tune_probes(lazy, executor)
    search_s = time.perf_counter() - started
    if found_or_none is None:
        record = _record(validation, lazy, None, (search_s, 0.0))
        raise AccuracyBudgetError(failure_message(record), budget=record)
    winner = found_or_none
    winner.chosen = True
    assert winner.spec is not None
    say(f"chosen: {winner.selection.num_kept} heads ({winner.strategy}, k={winner.k}); its recovery goes on to the "
        f"end of the protocol; {len(lazy.path)} of {every_step(steps)} candidates scored")
    t0 = time.perf_counter()
    finishing = dataclasses.replace(winner.spec, until_epochs=float(config.epochs), finish=True)
    winner.last, model, recovery = finish_candidate(finishing, winner.spec, inputs, executor)
    final_s = time.perf_counter() - t0
    refit: Reconstruction | None = None  # recovery finetune: the fine-tuning started from the pruned weights
    if reconstructs(config):
        refit = winner.reconstruction if winner.reconstruction is not None else rebuild(winner.selection, inputs)[1]
    return BudgetOutcome(selection=winner.selection, k=winner.k, model=model, recovery=recovery,
                         record=_record(validation, lazy, winner.step, (search_s, final_s)),
                         reconstruction=refit)


def _fine_tune_probes(lazy: LazyScores, executor: CandidateExecutor) -> Judged | None:
    """Fine-tune the knee's head count, then the head counts the calibrated margin predicts; the winner or None.

    The first probe is the knee's head count, fine-tuned as a single run would be (up to ``epochs``, pausing
    once it meets the budget): the budget then costs one run when the knee is the answer, and that probe
    calibrates the margin on a whole recovery for the look below or above it. Every later probe trains
    ``budget_screen_epochs`` at most. Only the winner's recovery goes on to the protocol's end, so a probe
    that wins costs nothing beyond the run it belongs to. The margin is
    what fine-tuning added to a probe's reconstructed score, so only a probe that trained measures it. A
    probe that already met the budget before its first epoch says nothing of it: while every probe so far
    was such a one, the step just below the winner is fine-tuned next. A runner-up of the same head count is
    probed only when the best missed and the two reconstructed scores are within the split's noise.
    """
    steps, inputs, say = lazy.steps, lazy.inputs, lazy.say
    config = inputs.config
    screen = min(float(config.epochs), float(config.budget_screen_epochs))
    margins: list[float] = []
    lo, hi, winner = -1, len(steps), None
    knee = next((i for i, step in enumerate(steps) if step.knee), None)

    def tried(entry: Judged, until: float) -> Judged | None:
        met = _probe(entry, inputs, executor, until, margins.append)
        assert entry.last is not None
        say(f"  {entry.strategy} at {entry.selection.num_kept} heads: best {entry.last.best.score:.4f} after "
            f"{entry.last.epochs:g} epoch(s) (reconstructed {entry.point.score:.4f}): {entry.last.reason}")
        return met

    while hi - lo > 1:
        margin = statistics.median(margins) if margins else 0.0

        def predicted_to_pass(j: Judged, m: float = margin) -> bool:
            return j.point.score + m >= inputs.threshold

        if knee is not None and lo < knee < hi:
            i, knee, until = knee, None, float(config.epochs)
            say(f"fine-tuning the knee's head count first ({steps[i].heads} heads), as a single run would: up to "
                f"{until:g} epoch(s), pausing once it meets the budget")
        else:
            until = screen
            predicted = lazy.first(lo, hi, predicted_to_pass,
                                   why=f", short of the budget even with a {100 * margin:+.2f}-point margin")
            if predicted is None and winner is not None:
                if margins:
                    break
                predicted = hi - 1  # no probe trained yet: measure the margin just below the winner
                say(f"no probe has trained yet (each met the budget before training): fine-tuning the step below, "
                    f"{steps[predicted].heads} heads, to measure what fine-tuning adds")
            i = predicted if predicted is not None else hi - 1
        group = lazy.group(i)
        ranked = sorted(group, key=Judged.rank, reverse=True)
        say(f"fine-tuning {ranked[0].strategy} at {steps[i].heads} heads for up to {until:g} epoch(s) (margin "
            f"{100 * margin:+.2f} points: predicted {100 * (ranked[0].point.score + margin):.2f} against "
            f"{100 * inputs.threshold:.2f})")
        met = tried(ranked[0], until)
        if not met and len(ranked) > 1 and _close(ranked[0], ranked[1], inputs):
            say(f"  the runner-up {ranked[1].strategy} is within the validation split's noise of it: probed too, "
                f"for up to {screen:g} epoch(s)")
            met = tried(ranked[1], screen)
        if met is not None:
            if winner is not None and winner.spec is not None:
                executor.release(winner.spec)
            winner, hi = met, i
        else:
            lo = i
    return winner


def _probe(entry: Judged, inputs: SearchInputs, executor: CandidateExecutor, until: float,
           measured: Callable[[float], None]) -> Judged | None:
    """Fine-tune ``entry`` for up to ``until`` epochs (pausing once it meets the budget); itself if it met it.

    ``measured`` hears what the probe added over its reconstructed score when it trained (a margin); a probe
    that missed is let go.
    """
    entry.spec = CandidateSpec(strategy=entry.strategy, k=entry.k, seed=inputs.config.seed, until_epochs=until,
                               kept={layer: tuple(h) for layer, h in entry.selection.kept.items()})
    result = executor.run([entry.spec], inputs)[0]
    entry.last = result
    if result.epochs > 0:
        measured(result.best.score - entry.point.score)
    if result.status == "within_budget":
        return entry
    executor.release(entry.spec)
    return None


def _close(best: Judged, other: Judged, inputs: SearchInputs) -> bool:
    """Whether ``other``'s reconstructed score is within the validation split's noise of ``best``'s."""
    noise = inputs.drop(best.predictions).half_width
    return 100.0 * (best.point.score - other.point.score) <= noise


def _candidate(entry: Judged, inputs: SearchInputs) -> BudgetCandidate:
    last = entry.last
    path = f"#{entry.order + 1} on the search's path" + (f" ({entry.note})" if entry.note else "")
    if last is None:
        point = entry.point
        return BudgetCandidate(
            strategy=entry.strategy, k=entry.k, heads_kept=entry.selection.num_kept, round=entry.order,
            accuracy_before=point.accuracy, macro_f1_before=point.macro_f1, accuracy_best=point.accuracy,
            macro_f1_best=point.macro_f1, epochs=0.0, curve=(point,), drop=inputs.drop(entry.predictions),
            within_budget=entry.meets, stopped="judged", seconds=entry.seconds, chosen=entry.chosen,
            reason=f"{path}: after reconstruction only" + (" (within the budget)" if entry.meets else ""),
            reconstructed=point)
    return BudgetCandidate(
        strategy=entry.strategy, k=entry.k, heads_kept=entry.selection.num_kept, round=entry.order,
        accuracy_before=last.curve[0].accuracy, macro_f1_before=last.curve[0].macro_f1,
        accuracy_best=last.best.accuracy, macro_f1_best=last.best.macro_f1, epochs=last.epochs, curve=last.curve,
        drop=last.drop, within_budget=last.status == "within_budget" or entry.chosen,
        stopped="within_budget" if entry.chosen else last.status,
        reason=f"{path}; fine-tuned: " + (f"met the budget, chosen, then trained on to {last.epochs:g} epoch(s): best "
                                          f"{last.best.score:.4f} after {last.best.epoch:g} epoch(s)"
                                          if entry.chosen else last.reason),
        seconds=entry.seconds + last.seconds, chosen=entry.chosen, reconstructed=entry.point)


def _record(validation: ValidationData, lazy: LazyScores, chosen_step: int | None,
            seconds: tuple[float, float]) -> BudgetRecord:
    """The search's record; ``seconds``: the search's and the chosen candidate's final recovery's."""
    inputs, steps, (search_s, final_s) = lazy.inputs, lazy.steps, seconds
    judged = lazy.path
    candidates = tuple(_candidate(j, inputs) for j in judged)
    chosen = next((j for j in judged if j.chosen), None)
    closest = chosen or max(judged, key=Judged.rank, default=None)
    per_epoch = [j.last.seconds / j.last.epochs for j in judged if j.last is not None and j.last.epochs > 0]
    return budget_record(inputs, validation, steps, SearchSummary(
        candidates, per_epoch=per_epoch, search_s=search_s, final_s=final_s,
        chosen=None if chosen is None else chosen.selection.num_kept,
        chosen_strategy=None if chosen is None else chosen.strategy, strategy_margin=None,
        noise_half_width=None if closest is None else inputs.drop(closest.predictions).half_width,
        skipped=lazy.skipped(chosen_step)))
