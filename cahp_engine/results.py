"""What every record of the engine is made of: JSON-ready both ways; importable without torch or numpy.

Each room keeps its records beside the code that makes them (``recovery``'s scores and fine-tunings,
``selection``'s sampling and stability, ``run``'s report); each is a frozen dataclass with :class:`JsonRecord`'s
``to_dict()`` (JSON types: lists for tuples, string keys) and its inverse ``from_dict()``. The accuracy budget's
record and its parts (:class:`BudgetRecord`, :class:`BudgetCandidate`, :class:`DropInterval`,
:class:`ValidationPoint`, made by :mod:`cahp_engine.run._budget`, :mod:`cahp_engine.recovery._bootstrap` and
:mod:`cahp_engine.recovery._best`) live here, on the bottom floor, because the engine's one error hierarchy
carries them (``AccuracyBudgetError.budget``).
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, Self


def jsonable(value: Any) -> Any:
    """``value`` with mappings keyed by strings, tuples as lists and numpy scalars as Python ones."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    # A numpy scalar can only exist once numpy is imported; this module does not import it itself.
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.generic):
        return value.item()
    return value


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def from_json(hint: Any, value: Any) -> Any:
    """Rebuild a value of type ``hint`` from its :func:`jsonable` form.

    Dataclasses are built field by field (unknown or missing keys raise ``ValueError``; a class's
    ``RENAMED_KEYS`` maps the older names of its keys to their names now, so that older files still read),
    tuples and mappings element by element (integer keys from their strings); scalars pass through as they are.
    """
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        if not isinstance(value, Mapping):
            raise ValueError(f"{hint.__name__} is read from an object, got {type(value).__name__}")
        renamed: Mapping[str, str] = getattr(hint, "RENAMED_KEYS", {})  # a key's older name -> its name now
        value = {renamed.get(key, key): item for key, item in value.items()} if renamed else value
        fields = [f for f in dataclasses.fields(hint) if f.init]
        names = {f.name for f in fields}
        unknown = sorted(set(value) - names)
        missing = sorted(f.name for f in fields if f.name not in value
                         and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        if unknown or missing:
            raise ValueError(f"{hint.__name__}: unknown keys {unknown}, missing keys {missing}")
        hints = _hints(hint)
        return hint(**{f.name: from_json(hints[f.name], value[f.name]) for f in fields if f.name in value})
    if origin in (types.UnionType, typing.Union):
        if value is None:
            return None
        options = [a for a in args if a is not type(None)]
        return from_json(options[0], value) if len(options) == 1 else value
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(from_json(args[0], v) for v in value)
        return tuple(from_json(a, v) for a, v in zip(args, value, strict=True))
    if origin in (dict, Mapping):
        key, item = args
        return {(int(k) if key is int else k): from_json(item, v) for k, v in value.items()}
    if origin is list:
        return [from_json(args[0], v) for v in value]
    return value


class JsonRecord:
    """Mixin for frozen dataclasses: ``to_dict()`` in field order, and ``from_dict()`` reversing it."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready mapping of every field, in field order."""
        out: dict[str, Any] = jsonable(dataclasses.asdict(self))  # type: ignore[call-overload]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """The record whose :meth:`to_dict` is ``data``."""
        record: Self = from_json(cls, data)
        return record


@dataclass(frozen=True)
class ValidationPoint(JsonRecord):
    """One evaluation on the validation split during a fine-tuning.

    Made after ``step`` optimiser steps (``epoch`` passes over the training data; step 0 is before
    training). ``score`` is the watched metric (accuracy or macro-F1, in [0, 1]); ``lost_classes``
    the classes the dense model recalls on that split and this model recalls none of (empty when the
    caller does not compare with a dense model).
    """

    step: int
    epoch: float
    score: float
    accuracy: float
    macro_f1: float
    lost_classes: tuple[int, ...] = ()


@dataclass(frozen=True)
class DropInterval(JsonRecord):
    """How far a candidate's validation score fell below the dense model's, with the noise of that figure.

    Every figure is in points (100 x the metric). ``drop`` is dense minus candidate on the validation
    split; ``low`` and ``high`` bound its 95 % paired-bootstrap interval (``resamples`` resamples of
    the split's rows, each scoring the dense and the candidate's predictions on the same rows) and
    ``half_width`` is half its width. ``upper`` is the one-sided ``confidence`` bound of the drop
    (None without ``budget_confidence``).
    """

    drop: float
    low: float
    high: float
    half_width: float
    resamples: int
    confidence: float | None = None
    upper: float | None = None


@dataclass(frozen=True)
class BudgetCandidate(JsonRecord):
    """One pruned model the accuracy budget recovered and scored on the validation split.

    Attributes
    ----------
    strategy : str
        The strategy that chose its heads (``cahp``, ``salience``, ...).
    k : int
        Clusters of the analysis the strategy chose at; ``heads_kept`` heads.
    round : int
        The search's round that tried it (0 first): one head count per round.
    accuracy_before, macro_f1_before : float
        The pruned model before recovery (the curve's first point).
    accuracy_best, macro_f1_best : float
        At its best evaluation (the weights it keeps).
    epochs : float
        Recovery epochs it trained, of the protocol's ``epochs``.
    curve : tuple of ValidationPoint
        Every evaluation, the first before training.
    drop : DropInterval
        At its best evaluation.
    within_budget : bool
        An evaluation met the budget: score >= threshold, no class lost and, with ``budget_confidence``, the drop's
        upper bound within P.
    stopped : str
        Why it stopped: ``within_budget``, ``halved`` (successive halving gave its round's more
        promising half the next epochs), ``cannot_reach`` (its curve could no longer reach the
        threshold), ``no_gain`` (early stopping), ``completed`` (every epoch, below the budget),
        ``round_decided`` (another candidate of its round met the budget first) or ``judged``.
    reason : str
        The same in words, with the figures that decided it.
    seconds : float
        Its pruning, recovery and evaluations.
    chosen : bool
        The run's result; it then trained to the end of the protocol, ``epochs`` and ``curve`` included.
    reconstructed : ValidationPoint or None
        Its score right after reconstruction (``stopped`` ``judged``: never trained).
    target_speedup, measured_speedup : float or None
        ``budget_objective`` ``speed``: the speed target it was cut to, and the speed-up measured on
        ``target_runtime`` (None for a head-count candidate).
    neurons_kept : int or None
        ``budget_objective`` ``speed``: feed-forward neurons kept, all layers together.
    """

    strategy: str
    k: int
    heads_kept: int
    round: int
    accuracy_before: float
    macro_f1_before: float
    accuracy_best: float
    macro_f1_best: float
    epochs: float
    curve: tuple[ValidationPoint, ...]
    drop: DropInterval
    within_budget: bool
    stopped: str
    reason: str
    seconds: float
    chosen: bool = False
    reconstructed: ValidationPoint | None = None
    target_speedup: float | None = None
    measured_speedup: float | None = None
    neurons_kept: int | None = None


@dataclass(frozen=True)
class SkippedCandidate(JsonRecord):
    """A candidate of the ladder the budget's search judged after reconstruction never scored, and why.

    Attributes
    ----------
    strategy : str
    k : int
    heads_kept : int
    reason : str
        In words, with the score that let the search pass it by (its bisection assumes the score rises
        with the head count).
    """

    strategy: str
    k: int
    heads_kept: int
    reason: str


@dataclass(frozen=True)
class BudgetRecord(JsonRecord):
    """The accuracy-budget search (:mod:`cahp_engine.run._budget`), here so that ``AccuracyBudgetError`` can carry it.

    Attributes
    ----------
    max_accuracy_drop : float
        P, in points.
    metric : str
        ``accuracy`` or ``macro_f1``.
    split : str
        The validation split's name, or ``train`` when it was carved from the training split.
    carved : bool
        True when ``validation_rows`` rows (a seeded stratified 10 %) were carved from the training
        split and left out of selection and of every fine-tuning.
    validation_rows : int
    dense_validation : float
        The dense model's score on that split, in the budget's metric.
    threshold : float
        ``dense_validation - P / 100``: a candidate must reach it.
    strategies : tuple of str
        The strategies whose choices were candidates at each head count (``budget_strategies``).
    confidence : float or None
        ``budget_confidence``: the drop's one-sided upper bound at this confidence must be within P.
    ladder : tuple of int
        The head counts the search could try, fewest first (CAHP's count at each k of the ladder).
    candidates : tuple of BudgetCandidate
        Every candidate tried, in the order tried.
    chosen : int or None
        ``heads_kept`` of the candidate returned (None when none met the budget).
    chosen_strategy : str or None
        Its strategy.
    strategy_margin : float or None
        The chosen candidate's best score minus the best of the other strategies' candidates at the
        same head count, each over the evaluations both reached, in points (None when it had no rival).
    noise_half_width : float or None
        Half the width of the 95 % interval of the chosen candidate's drop (on failure: of the
        candidate that came closest), in points: what the validation split can resolve.
    epochs_trained : float
        Recovery epochs of every candidate together, the chosen one's whole recovery included.
    search_seconds : float
        Every candidate's pruning, recovery and evaluations until the search decided.
    final_recovery_seconds : float
        The chosen candidate's remaining epochs after the search decided (its recovery goes on; it is
        not started again). The fastest-target search (``objective`` ``speed``): the chosen target's
        whole recovery, which starts again from its reconstructed weights.
    cost_vs_single_run : float or None
        ``(search_seconds + final_recovery_seconds) / single`` where ``single`` is ``epochs`` at the
        candidates' median seconds per epoch: what the budget cost against one recovery at a knee. Under
        ``recovery`` reconstruct (nothing fine-tuned), ``single`` is the candidates' median seconds (one
        candidate's pruning, reconstruction and scoring: a reconstruct run's recovery). The fastest-target search
        that fine-tunes: ``single`` is the chosen target's recovery. None when nothing was scored.
    skipped : tuple of SkippedCandidate
        Judged after reconstruction: the ladder's candidates the search's bisection never scored, with
        why (``candidates`` holds the scored ones, in the order scored: the search's path).
    objective : str
        ``budget_objective``: ``heads`` (the fewest heads within P) or ``speed`` (the fastest target).
    targets : tuple of float
        ``speed``: the ladder of speed targets the bisection could try (``ladder`` is then empty).
    chosen_target : float or None
        ``speed``: the speed target of the chosen candidate.
    """

    max_accuracy_drop: float
    metric: str
    split: str
    carved: bool
    validation_rows: int
    dense_validation: float
    threshold: float
    strategies: tuple[str, ...]
    confidence: float | None
    ladder: tuple[int, ...]
    candidates: tuple[BudgetCandidate, ...]
    chosen: int | None
    chosen_strategy: str | None
    strategy_margin: float | None
    noise_half_width: float | None
    epochs_trained: float
    search_seconds: float
    final_recovery_seconds: float
    cost_vs_single_run: float | None
    skipped: tuple[SkippedCandidate, ...] = ()
    objective: str = "heads"
    targets: tuple[float, ...] = ()
    chosen_target: float | None = None
