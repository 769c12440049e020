"""An accuracy budget: the smallest pruned model whose validation score stays within P points of the dense one.

CI users think in budgets ("prune as far as you can while losing at most one point"), not in knees.
With ``max_accuracy_drop`` set, the run tries candidate head counts from the smallest, recovers each
briefly, and keeps the first whose validation score after that short recovery is within P points of
the dense model's; only the chosen candidate gets the full recovery.

Candidates are CAHP's own choices at the knees of the MSS curve for every reported polynomial degree
(degree 6 first, so the fewest clusters first), then at larger k between the largest knee and N - 1,
each step halving the distance left, so a budget too tight for every knee still finds the smallest
count that meets it. Candidates that keep the same number of heads are tried once.

The search never reads the evaluation (test) split: it scores on the dataset's validation split when
it has one that is not the evaluation split, else on a seeded stratified 10 % carved from the training
split, which is then left out of selection and of every fine-tuning (:func:`validation_data`).

References
----------
Intel Neural Compressor's accuracy criterion (a tolerable relative or absolute loss) is the nearest
convention; no head-pruning tool offers a budget.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from torch import nn

from cahp_engine.data import DEFAULT_MAX_ROWS, DatasetOptions, DatasetSplits, LabelledTexts, load_splits
from cahp_engine.errors import AccuracyBudgetError, DatasetError
from cahp_engine.results import BudgetCandidate, BudgetRecord, ClassificationMetrics, TrainingResult
from cahp_engine.selection import HeadAnalysis, Selection, choose

__all__ = ["CARVE_FRACTION", "VALIDATION_SPLITS", "BudgetOutcome", "Candidate", "ValidationData", "candidates",
           "carve", "score_of", "search", "validation_data"]

#: Split names taken as a validation split, in this order, when the dataset has one.
VALIDATION_SPLITS: tuple[str, ...] = ("validation", "dev", "valid", "val", "validation_matched")
#: Share of each class carved from the training split when the dataset has no validation split.
CARVE_FRACTION = 0.1


@dataclass(frozen=True)
class ValidationData:
    """What the budget scores on, and what is left to train on.

    ``train`` is the training split, less the carved rows when ``carved``; ``split`` names the
    validation split (``train`` when carved).
    """

    train: LabelledTexts
    validation: LabelledTexts
    split: str
    carved: bool


def carve(train: LabelledTexts, seed: int, fraction: float = CARVE_FRACTION) -> tuple[LabelledTexts, LabelledTexts]:
    """Split ``train`` into (rest, held-out): ``round(fraction * n_c)`` rows of each class ``c``, at least one.

    A class with a single row stays whole in ``rest`` (it must be trained on). The draw is seeded by
    ``seed`` and independent of every other random choice of the run.
    """
    labels = np.asarray(train.labels)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xB0D9E7]))
    held: list[np.ndarray] = []
    for c in range(train.num_classes):
        rows = np.flatnonzero(labels == c)
        if len(rows) < 2:
            continue
        take = min(len(rows) - 1, max(1, int(round(fraction * len(rows)))))
        held.append(rng.permutation(rows)[:take])
    if not held:
        raise DatasetError("the training split is too small to carve a validation split from (every class has one "
                           "row); add a `validation` split to the dataset")
    out = np.sort(np.concatenate(held))
    rest = np.setdiff1d(np.arange(len(train)), out)
    return train.subset(rest), train.subset(out)


def validation_data(splits: DatasetSplits, dataset_ref: str, options: DatasetOptions, *, seed: int,
                    revision: str | None = None, cache_dir: str | None = None,
                    token: str | None = None, max_rows: int | None = DEFAULT_MAX_ROWS) -> ValidationData:
    """The budget's validation split: the dataset's own when it has one, else carved from train.

    A split of :data:`VALIDATION_SPLITS` qualifies when it is neither the training nor the
    evaluation split; its labels are mapped as the training split maps them.
    """
    for name in VALIDATION_SPLITS:
        if name in splits.splits_found and name not in (options.train_split, splits.eval_split):
            read = load_splits(dataset_ref, dataclasses.replace(options, eval_split=name), revision=revision,
                               cache_dir=cache_dir, token=token, max_rows=max_rows)
            if read.label_names != splits.label_names:
                raise DatasetError(f"split {name!r} maps the labels as {list(read.label_names)} but the training split "
                                   f"as {list(splits.label_names)}; give both splits the same classes")
            return ValidationData(train=splits.train, validation=read.eval, split=name, carved=False)
    rest, held = carve(splits.train, seed)
    return ValidationData(train=rest, validation=held, split=options.train_split, carved=True)


@dataclass(frozen=True)
class Candidate:
    """CAHP's (or the configured strategy's) choice at ``k`` clusters."""

    k: int
    selection: Selection


def candidates(analysis: HeadAnalysis, strategy: str, *, seed: int) -> list[Candidate]:
    """Every head count the budget may try, fewest heads first, one per distinct ``heads_kept``.

    The knees of every degree in ``analysis.knees``, then k between the largest knee and N - 1, each
    step halving the distance left.
    """
    n_heads = int(analysis.salience.size)
    ks = sorted({knee.k for knee in analysis.knees.values()})
    k = ks[-1] if ks else 1
    while k < n_heads - 1:
        k += max(1, (n_heads - 1 - k) // 2)
        ks.append(k)
    seen: set[int] = set()
    out: list[Candidate] = []
    for k in sorted(set(ks)):
        selection = choose(analysis, k, strategy, seed=seed)
        if selection.num_kept in seen:
            continue
        seen.add(selection.num_kept)
        out.append(Candidate(k=k, selection=selection))
    return sorted(out, key=lambda c: c.selection.num_kept)


def score_of(metrics: ClassificationMetrics, metric: str) -> float:
    """The budget's metric of ``metrics``, in [0, 1]."""
    return float(metrics.accuracy if metric == "accuracy" else metrics.macro_f1)


@dataclass(frozen=True)
class BudgetOutcome:
    """The chosen candidate: its selection, its recovered model and that recovery; the search's record."""

    candidate: Candidate
    model: nn.Module
    recovery: TrainingResult
    record: BudgetRecord


#: ``prune(selection) -> a fresh pruned copy of the dense model``.
PruneFn = Callable[[Selection], nn.Module]
#: ``recover(model, epochs) -> TrainingResult`` (in place).
RecoverFn = Callable[[nn.Module, float], TrainingResult]
#: ``score(model) -> metrics on the validation split``.
ScoreFn = Callable[[nn.Module], ClassificationMetrics]


def search(
    options: list[Candidate],
    *,
    max_drop: float,
    metric: str,
    dense_validation: ClassificationMetrics,
    validation: ValidationData,
    screen_epochs: float,
    epochs: float,
    prune: PruneFn,
    recover: RecoverFn,
    score: ScoreFn,
    say: Callable[[str], None] = lambda _line: None,
) -> BudgetOutcome:
    """Try ``options`` in order and return the first within ``max_drop`` points, fully recovered.

    Each candidate is pruned from the dense model, scored, recovered for ``min(screen_epochs,
    epochs)`` epochs and scored again; the first whose score is at least ``dense - max_drop / 100``
    is chosen and, when the screening was shorter than ``epochs``, recovered again from a fresh
    pruned copy for ``epochs``. ``score`` reads the validation split only.

    Raises
    ------
    AccuracyBudgetError
        When no candidate meets the budget; its ``budget`` holds the record of every candidate.
    """
    dense = score_of(dense_validation, metric)
    threshold = dense - max_drop / 100.0
    screen = min(screen_epochs, epochs)
    say(f"accuracy budget: {metric} on {validation.split!r} ({len(validation.validation)} rows"
        f"{', carved from train' if validation.carved else ''}) must stay >= {threshold:.4f} "
        f"(dense {dense:.4f} - {max_drop:g} points); {len(options)} candidates, {screen:g} screening epoch(s)")
    tried: list[BudgetCandidate] = []
    started = time.perf_counter()
    chosen: tuple[Candidate, nn.Module, TrainingResult] | None = None
    for option in options:
        t0 = time.perf_counter()
        model = prune(option.selection)
        before = score(model)
        training = recover(model, screen)
        after = score(model)
        ok = score_of(after, metric) >= threshold
        tried.append(BudgetCandidate(
            k=option.k, heads_kept=option.selection.num_kept, accuracy_before=before.accuracy,
            macro_f1_before=before.macro_f1, accuracy_after=after.accuracy, macro_f1_after=after.macro_f1,
            screen_epochs=screen, within_budget=ok, seconds=time.perf_counter() - t0))
        say(f"  candidate k={option.k}: {option.selection.num_kept} heads, {metric} {score_of(before, metric):.4f} "
            f"-> {score_of(after, metric):.4f} after {screen:g} epoch(s)" + (" (within budget)" if ok else ""))
        if ok:
            chosen = (option, model, training)
            break
        del model
    search_s = time.perf_counter() - started
    per_epoch = [c.seconds / max(c.screen_epochs, 1e-9) for c in tried]

    def record(chosen_heads: int | None, final_s: float, single: float | None,
               final: ClassificationMetrics | None) -> BudgetRecord:
        candidates_out = tuple(tried)
        if final is not None:
            candidates_out = (*tried[:-1], dataclasses.replace(tried[-1], accuracy_final=final.accuracy,
                                                                   macro_f1_final=final.macro_f1))
        return BudgetRecord(
            max_accuracy_drop=float(max_drop), metric=metric, split=validation.split, carved=validation.carved,
            validation_rows=len(validation.validation), dense_validation=dense, threshold=threshold,
            candidates=candidates_out, chosen=chosen_heads, search_seconds=search_s, final_recovery_seconds=final_s,
            cost_vs_single_run=None if not single else (search_s + final_s) / single)

    if chosen is None:
        best = max(tried, key=lambda c: c.accuracy_after if metric == "accuracy" else c.macro_f1_after)
        best_score = best.accuracy_after if metric == "accuracy" else best.macro_f1_after
        estimate = float(np.median(per_epoch)) * epochs if per_epoch else None
        raise AccuracyBudgetError(
            f"no candidate kept validation {metric} within {max_drop:g} points of the dense model's {dense:.4f} "
            f"(threshold {threshold:.4f}); the best was {best.heads_kept} heads at {best_score:.4f} after "
            f"{screen:g} screening epoch(s). Raise `max_accuracy_drop`, or `budget_screen_epochs` so candidates "
            "recover further before they are judged",
            budget=record(None, 0.0, estimate, None))
    option, model, training = chosen
    if screen < epochs:
        t0 = time.perf_counter()
        model = prune(option.selection)
        training = recover(model, epochs)
        final = score(model)
        final_s = time.perf_counter() - t0
        say(f"chosen {option.selection.num_kept} heads: {metric} {score_of(final, metric):.4f} after {epochs:g} epochs")
        return BudgetOutcome(candidate=option, model=model, recovery=training,
                             record=record(option.selection.num_kept, final_s, final_s, final))
    return BudgetOutcome(candidate=option, model=model, recovery=training,
                         record=record(option.selection.num_kept, 0.0, tried[-1].seconds, None))
