"""An accuracy budget: the smallest pruned model whose validation score stays within P points of the dense one.

CI users think in budgets ("prune as far as you can while losing at most one point"), not in knees.
With ``max_accuracy_drop`` set, the run searches the head counts for the smallest whose recovered
validation score is within P points of the dense model's, with no class lost:

* **The ladder**: the knee of every reported polynomial degree, then k between the largest knee and
  N - 1, each step halving the distance left; one step per distinct head count (CAHP's count at k),
  fewest heads first (:func:`ladder`). At each step every strategy of ``budget_strategies`` makes a
  candidate (CAHP's choice, salience top-k at the same count, ...), one per distinct head set.
* **Bisection, or a k-ary search**: more heads do not score much worse, so the search narrows the
  ladder round by round (a head count that meets the budget moves the upper end down, one that does
  not moves the lower end up). A round tries ``budget_parallel`` head counts at once, evenly spaced
  (:func:`probes`): 1 is bisection, about log2(steps + 1) rounds; W head counts need about
  log_(W+1)(steps + 1) rounds, for a pool of workers to run side by side.
* **Successive halving in a round** (Hyperband's rule): every candidate of the round trains
  ``budget_screen_epochs`` of its recovery, then the more promising half of each head count (by its
  best validation score) trains on for twice as far, and so on to the recovery's end. A candidate
  pauses as soon as it meets the budget (its best weights are kept, so it cannot end lower), and
  stops when its curve can no longer reach the threshold or early stopping ends it
  (:mod:`cahp_engine.run._candidates`). At the end of a rung in which some candidate of a head count
  met the budget, the best of those that met it wins that head count, and larger head counts of the
  round stop; the round's answer is the fewest heads won.
* **Who runs the candidates** does not change the answer: a rung's pieces of work go out together to a
  :class:`~cahp_engine.run._executors.CandidateExecutor` (this process in turn, or the job service's
  worker pool) and every decision waits for the whole rung.
* **No second recovery**: every candidate is recovered with the final protocol (the same ``epochs``,
  schedule, early stopping, loss and class weights); the chosen candidate's recovery goes on from where
  the search paused it to the protocol's end, and its best weights are the result.

The search never reads the evaluation (test) split: it scores on the validation split
(:mod:`cahp_engine.run._holdout`).

References
----------
Intel Neural Compressor's accuracy criterion (a tolerable relative or absolute loss) is the nearest
convention; no head-pruning tool offers a budget. Li et al., "Hyperband" (JMLR 2018), successive halving.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn

from cahp_engine.errors import AccuracyBudgetError
from cahp_engine.recovery import Reconstruction, TrainingResult
from cahp_engine.results import BudgetCandidate, BudgetRecord, SkippedCandidate
from cahp_engine.run._candidates import (
    CandidateResult,
    CandidateSpec,
    SearchInputs,
)
from cahp_engine.run._executors import CandidateExecutor, InTurn, finish_candidate
from cahp_engine.run._holdout import ValidationData
from cahp_engine.run._reconstruct import finetunes
from cahp_engine.selection import HeadAnalysis, Selection, choose

__all__ = ["BudgetOutcome", "LadderStep", "budget_warnings", "failure_message", "ladder", "probes", "search"]


@dataclass(frozen=True)
class LadderStep:
    """One head count of the ladder: ``k`` clusters, CAHP's ``heads`` there, and each strategy's choice.

    ``same`` names, for a strategy left out of ``options`` because its choice repeats an earlier one's
    head set, the strategy whose option stands for it.
    """

    k: int
    heads: int
    options: tuple[tuple[str, Selection], ...]
    same: tuple[tuple[str, str], ...] = ()
    knee: bool = False  # CAHP's head count at the run's own knee (what a single run would keep)


def ladder(analysis: HeadAnalysis, strategies: tuple[str, ...], *, seed: int,
           knee: int | None = None) -> list[LadderStep]:
    """Every head count the budget may try, fewest heads first, one per distinct CAHP head count.

    The knees of every degree in ``analysis.knees``, then k between the largest knee and N - 1, each
    step halving the distance left. A strategy whose choice repeats an earlier one's head set at the
    same step is left out of it. ``knee`` (the run's own k) marks the step of CAHP's head count there.
    """
    n_heads = int(analysis.salience.size)
    ks = sorted({found.k for found in analysis.knees.values()} | ({knee} if knee is not None else set()))
    knee_heads = None if knee is None else choose(analysis, knee, "cahp", seed=seed).num_kept
    k = ks[-1] if ks else 1
    while k < n_heads - 1:
        k += max(1, (n_heads - 1 - k) // 2)
        ks.append(k)
    seen: set[int] = set()
    out: list[LadderStep] = []
    for k in sorted(set(ks)):
        heads = choose(analysis, k, "cahp", seed=seed).num_kept
        if heads in seen:
            continue
        seen.add(heads)
        options: list[tuple[str, Selection]] = []
        same: list[tuple[str, str]] = []
        for name in strategies:
            selection = choose(analysis, k, name, seed=seed)
            repeated = next((other for other, chosen in options if (selection.kept_mask == chosen.kept_mask).all()),
                            None)
            if repeated is None:
                options.append((name, selection))
            else:
                same.append((name, repeated))
        out.append(LadderStep(k=k, heads=heads, options=tuple(options), same=tuple(same), knee=heads == knee_heads))
    return sorted(out, key=lambda step: step.heads)


@dataclass(frozen=True)
class BudgetOutcome:
    """The chosen candidate: its selection and k, its recovered model and that recovery; the search's record;
    its layer-wise reconstruction when the search judged the candidates after one (else None)."""

    selection: Selection
    k: int
    model: nn.Module
    recovery: TrainingResult
    record: BudgetRecord
    reconstruction: Reconstruction | None = None


@dataclass(frozen=True)
class SearchSummary:
    """What one search tried, chose and cost: :func:`budget_record` adds the settings and the ladder.

    Attributes
    ----------
    candidates : tuple of BudgetCandidate
        Every candidate scored, in the order tried.
    per_epoch : list of float
        The candidates' seconds per recovery epoch, which price a single run (empty: none trained).
    search_s, final_s : float
        Seconds of the search, and of the chosen candidate's recovery after it.
    chosen : int or None
        Heads the chosen candidate kept (None: none met the budget).
    chosen_strategy : str or None
    strategy_margin : float or None
        Points by which the chosen candidate beat its rivals at its head count.
    noise_half_width : float or None
        Half the 95 % interval of the drop of the chosen (or closest) candidate.
    skipped : tuple of SkippedCandidate
    """

    candidates: tuple[BudgetCandidate, ...]
    per_epoch: list[float]
    search_s: float
    final_s: float
    chosen: int | None
    chosen_strategy: str | None
    strategy_margin: float | None
    noise_half_width: float | None
    skipped: tuple[SkippedCandidate, ...] = ()


@dataclass
class _Tried:
    """A candidate the search started: where it stands and what it last reported. ``spec`` is its next piece of
    work, and says which strategy's choice at which ``k`` it is."""

    selection: Selection
    round: int
    spec: CandidateSpec
    last: CandidateResult | None = None
    stopped: str | None = None
    reason: str = ""
    chosen: bool = False

    @property
    def strategy(self) -> str:
        return self.spec.strategy

    @property
    def k(self) -> int:
        return self.spec.k

    def rank(self) -> tuple[bool, float]:
        assert self.last is not None
        return (not self.last.best.lost_classes, self.last.best.score)


@dataclass
class _Search:
    """One search's shared state: its inputs, who runs the candidates, where its lines go, every candidate
    started, and the largest gain per epoch seen (``gain[0]``; None: none yet)."""

    inputs: SearchInputs
    executor: CandidateExecutor
    say: Callable[[str], None]
    tried: list[_Tried] = field(default_factory=list)
    gain: list[float | None] = field(default_factory=lambda: [None])


def probes(lo: int, hi: int, width: int) -> list[int]:
    """The ladder indices a round tries between ``lo`` and ``hi`` (both excluded): ``width`` evenly spaced.

    ``width`` 1 is bisection (the middle); more split the interval into ``width + 1`` parts, so a round
    of a k-ary search narrows it ``width + 1``-fold.
    """
    picked = sorted({lo + ((hi - lo) * j) // (width + 1) for j in range(1, width + 1)} - {lo, hi})
    return picked or [(lo + hi) // 2]


def search(steps: list[LadderStep], inputs: SearchInputs, *, validation: ValidationData,
           executor: CandidateExecutor | None = None,
           say: Callable[[str], None] = lambda _line: None) -> BudgetOutcome:
    """Search ``steps`` for the fewest heads within the budget and return that candidate, fully recovered.

    Each round tries ``budget_parallel`` head counts of the ladder at once (1: bisection); ``executor``
    runs the candidates (default :class:`~cahp_engine.run._executors.InTurn`, one after another here).

    Raises
    ------
    AccuracyBudgetError
        When no candidate meets the budget; its ``budget`` holds the record of every candidate.
    """
    config = inputs.config
    executor = executor if executor is not None else InTurn()
    metric, max_drop = config.budget_metric, float(config.max_accuracy_drop or 0.0)
    dense = inputs.threshold + max_drop / 100.0
    strict = "" if config.budget_confidence is None else (
        f", and the drop's upper bound at {config.budget_confidence:g} within {max_drop:g} points")
    width = max(1, int(config.budget_parallel))
    say(f"accuracy budget: {metric} on {validation.split!r} ({len(validation.validation)} rows"
        f"{', carved from train' if validation.carved else ''}) must stay >= {inputs.threshold:.4f} "
        f"(dense {dense:.4f} - {max_drop:g} points) with no class lost{strict}; {len(steps)} head counts "
        f"({', '.join(str(s.heads) for s in steps)}), strategies {', '.join(config.budget_strategies)}, "
        f"{width} head count(s) per round")
    started = time.perf_counter()
    state = _Search(inputs=inputs, executor=executor, say=say)
    lo, hi, winner, number = -1, len(steps), None, 0
    while hi - lo > 1:
        picked = probes(lo, hi, width)
        found = _round(state, [steps[i] for i in picked], number)
        number += 1
        if found is not None:
            at, best = found
            if winner is not None:
                executor.release(winner.spec)
            hi, winner = picked[at], best
            lo = max([lo, *(i for i in picked if i < hi)])
        else:
            lo = picked[-1]
    search_s = time.perf_counter() - started
    if winner is None:
        record = _record(state, validation, steps, search_s, 0.0)
        raise AccuracyBudgetError(failure_message(record), budget=record)
    winner.chosen = True
    say(f"chosen: {winner.selection.num_kept} heads ({winner.strategy}, k={winner.k}); its recovery goes on to "
        "the end of the protocol")
    t0 = time.perf_counter()
    finishing = dataclasses.replace(winner.spec, until_epochs=float(config.epochs), finish=True, gain_per_epoch=None)
    winner.last, model, recovery = finish_candidate(finishing, winner.spec, inputs, executor)
    final_s = time.perf_counter() - t0
    point = winner.last.best
    winner.reason += (f"; chosen, then trained on to {recovery.epochs:g} epoch(s)"
                      + (" (early stopping)" if recovery.stopped_early else "")
                      + f": best {point.score:.4f} after {point.epoch:g} epoch(s)")
    record = _record(state, validation, steps, search_s, final_s)
    return BudgetOutcome(selection=winner.selection, k=winner.k, model=model, recovery=recovery, record=record)


def _round(state: _Search, steps: list[LadderStep], number: int) -> tuple[int, _Tried] | None:
    """One round: successive halving over the candidates of ``steps`` (fewest heads first), rung by rung.

    Every rung's pieces go to ``executor`` together and every decision is taken on the whole rung's
    results (the abandonment rule's gain per epoch too), so the outcome does not depend on who ran
    what. A head count is decided when one of its candidates meets the budget (the best of those that
    did wins it) or none is left; once a head count is won, the larger ones of the round stop. Returns
    the index in ``steps`` of the fewest heads won, with its winner, or None when none was.
    """
    inputs, tried, gain, executor, say = state.inputs, state.tried, state.gain, state.executor, state.say
    config = inputs.config
    epochs = float(config.epochs)
    entries: dict[int, list[_Tried]] = {}
    for i, step in enumerate(steps):
        entries[i] = [_Tried(selection=sel, round=number,
                             spec=CandidateSpec(strategy=name, k=step.k, seed=config.seed, until_epochs=0.0,
                                                kept={layer: tuple(heads) for layer, heads in sel.kept.items()}))
                      for name, sel in step.options]
        tried.extend(entries[i])
    say(f"round {number}: " + "; ".join(f"{step.heads} heads (k={step.k}), {len(entries[i])} candidate(s)"
                                        for i, step in enumerate(steps)))
    until = min(epochs, float(config.budget_screen_epochs))
    active = {i: list(group) for i, group in entries.items()}
    won: dict[int, _Tried] = {}
    while active:
        work = [entry for i in sorted(active) for entry in active[i]]
        for entry in work:
            entry.spec = dataclasses.replace(entry.spec, until_epochs=until, gain_per_epoch=gain[0])
        results = executor.run([entry.spec for entry in work], inputs)
        for entry, result in zip(work, results, strict=True):
            entry.last = result
            if result.status != "paused":
                entry.stopped, entry.reason = result.status, result.reason
            say(f"  {entry.strategy} at {entry.selection.num_kept} heads: best {config.budget_metric} "
                f"{result.best.score:.4f} after {result.epochs:g} epoch(s): {result.reason}")
        gains = [g for entry in work if entry.last is not None for g in entry.last.gains_per_epoch()]
        if gains:
            gain[0] = max(gains + ([] if gain[0] is None else [gain[0]]))
        for i in sorted(active):
            met = [entry for entry in active[i] if entry.stopped == "within_budget"]
            if met:
                won[i] = max(met, key=_Tried.rank)
                _end(entries[i], won[i], "round_decided",
                     f"{won[i].strategy} met the budget first at this head count", executor)
                del active[i]
        if won:
            fewest = min(won)
            for i in [i for i in active if i > fewest]:
                _end(entries[i], None, "round_decided", f"{steps[fewest].heads} heads met the budget in this round",
                     executor)
                del active[i]
        for i in list(active):
            survivors = sorted((e for e in active[i] if e.stopped is None), key=_Tried.rank, reverse=True)
            keep = survivors[: math.ceil(len(survivors) / 2)]
            for entry in survivors[len(keep):]:
                entry.stopped, entry.reason = "halved", (
                    f"successive halving: {entry.last.best.score if entry.last else 0:.4f} after {until:g} epoch(s) "
                    "was in the less promising half of its head count")
            for entry in entries[i]:
                if entry.stopped is not None:
                    executor.release(entry.spec)
            if keep:
                active[i] = keep
            else:
                del active[i]
        until = min(epochs, until * 2)
    if not won:
        return None
    fewest = min(won)
    for i, best in won.items():
        if i != fewest:
            executor.release(best.spec)
    return fewest, won[fewest]


def _end(entries: list[_Tried], keep: _Tried | None, status: str, why: str, executor: CandidateExecutor) -> None:
    """Stop and let go every candidate of ``entries`` but ``keep`` (their records stay)."""
    for entry in entries:
        if entry is keep:
            continue
        if entry.stopped is None:
            entry.stopped, entry.reason = status, (
                f"{why}; stopped after {entry.last.epochs if entry.last else 0:g} epoch(s)")
        executor.release(entry.spec)


def _record(state: _Search, validation: ValidationData, steps: list[LadderStep], search_s: float,
            final_s: float) -> BudgetRecord:
    inputs, tried = state.inputs, state.tried
    candidates = tuple(_candidate_record(t) for t in tried if t.last is not None)
    chosen = next((t for t in tried if t.chosen), None)
    closest = chosen or min((t for t in tried if t.last is not None), key=lambda t: t.last.drop.drop if t.last
                            else math.inf, default=None)
    per_epoch = [t.last.seconds / t.last.epochs for t in tried if t.last is not None and t.last.epochs > 0]
    return budget_record(inputs, validation, steps, SearchSummary(
        candidates, per_epoch=per_epoch, search_s=search_s, final_s=final_s,
        chosen=None if chosen is None else chosen.selection.num_kept,
        chosen_strategy=None if chosen is None else chosen.strategy,
        strategy_margin=None if chosen is None else _margin(
            chosen, [t for t in tried if t.round == chosen.round and t.k == chosen.k]),
        noise_half_width=None if closest is None or closest.last is None else closest.last.drop.half_width))


def budget_record(inputs: SearchInputs, validation: ValidationData, steps: list[LadderStep],
                  summary: SearchSummary) -> BudgetRecord:
    """A search's :class:`BudgetRecord`: the settings, the ladder and the cost every search reports, with what it
    chose."""
    config, per_epoch, candidates = inputs.config, summary.per_epoch, summary.candidates
    single = statistics.median(per_epoch) * float(config.epochs) if per_epoch else None
    if not finetunes(config) and not per_epoch:
        # No fine-tuning: one run's recovery is one candidate's pruning, reconstruction and scoring.
        single = statistics.median([c.seconds for c in candidates]) if candidates else None
    spent = summary.search_s + summary.final_s
    return BudgetRecord(
        max_accuracy_drop=float(config.max_accuracy_drop or 0.0), metric=config.budget_metric, split=validation.split,
        carved=validation.carved, validation_rows=len(validation.validation),
        dense_validation=inputs.threshold + float(config.max_accuracy_drop or 0.0) / 100.0,
        threshold=inputs.threshold, strategies=tuple(config.budget_strategies), confidence=config.budget_confidence,
        ladder=tuple(s.heads for s in steps), candidates=candidates, chosen=summary.chosen,
        chosen_strategy=summary.chosen_strategy, strategy_margin=summary.strategy_margin,
        noise_half_width=summary.noise_half_width, epochs_trained=sum(c.epochs for c in candidates),
        search_seconds=summary.search_s, final_recovery_seconds=summary.final_s,
        cost_vs_single_run=None if not single else spent / single, skipped=summary.skipped)


def _candidate_record(t: _Tried) -> BudgetCandidate:
    last = t.last
    assert last is not None
    first, best = last.curve[0], last.best
    return BudgetCandidate(
        strategy=t.strategy, k=t.k, heads_kept=t.selection.num_kept, round=t.round,
        accuracy_before=first.accuracy, macro_f1_before=first.macro_f1, accuracy_best=best.accuracy,
        macro_f1_best=best.macro_f1, epochs=last.epochs, curve=last.curve, drop=last.drop,
        within_budget=t.stopped == "within_budget",
        stopped=t.stopped or last.status, reason=t.reason or last.reason, seconds=last.seconds, chosen=t.chosen)


def _margin(chosen: _Tried, rivals: list[_Tried]) -> float | None:
    """Points by which ``chosen``'s best score beat its round's other candidates', over the evaluations both made."""
    others = [r for r in rivals if r is not chosen and r.last is not None]
    if not others or chosen.last is None:
        return None
    gaps = []
    for other in others:
        assert other.last is not None
        n = min(len(chosen.last.curve), len(other.last.curve))
        gaps.append(max(p.score for p in chosen.last.curve[:n]) - max(p.score for p in other.last.curve[:n]))
    return 100.0 * min(gaps)


def failure_message(record: BudgetRecord) -> str:
    metric, p = record.metric, record.max_accuracy_drop
    best = max(record.candidates, key=lambda c: (c.accuracy_best if metric == "accuracy" else c.macro_f1_best),
               default=None)
    text = (f"no candidate kept validation {metric} within {p:g} points of the dense model's "
            f"{record.dense_validation:.4f} (threshold {record.threshold:.4f}) with no class lost")
    if best is not None:
        score = best.accuracy_best if metric == "accuracy" else best.macro_f1_best
        text += (f"; the best was {best.heads_kept} heads ({best.strategy}) at {score:.4f} after {best.epochs:g} "
                 f"epoch(s), a drop of {best.drop.drop:.2f} points (95 % interval {best.drop.low:.2f} to "
                 f"{best.drop.high:.2f})")
    return text + (". Raise `max_accuracy_drop`, or recover longer (`epochs`), or set `class_weight` balanced when "
                   "a class was lost")


def budget_warnings(record: BudgetRecord) -> list[str]:
    """A warning when P is smaller than the noise of the validation split (half the drop's 95 % interval)."""
    half = record.noise_half_width
    if half is None or record.max_accuracy_drop >= half:
        return []
    return [f"the validation split cannot tell a {record.max_accuracy_drop:g}-point drop from noise: +-{half:.1f} "
            f"points (95 % interval of the drop over {record.validation_rows} rows); a larger validation split or a "
            "larger `max_accuracy_drop` makes the budget's decision meaningful"]
