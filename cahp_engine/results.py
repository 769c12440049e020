"""Small frozen records of what a stage measured, JSON-ready both ways; importable without torch or numpy.

:class:`ClassificationMetrics`, :class:`ParameterCounts`, :class:`Latency` / :class:`SpeedComparison` come from
:mod:`cahp_engine.recovery._evaluation`, :class:`TrainingResult` from :mod:`cahp_engine.recovery._training`; all go
into the run report (:mod:`cahp_engine.run._report`).
Each has ``to_dict()`` (JSON types: lists for tuples, string keys) and its inverse ``from_dict()`` (``JsonRecord``).
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

    Dataclasses are built field by field (unknown or missing keys raise ``ValueError``), tuples and
    mappings element by element (integer keys from their strings); scalars pass through as they are.
    """
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        if not isinstance(value, Mapping):
            raise ValueError(f"{hint.__name__} is read from an object, got {type(value).__name__}")
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
class ClassificationMetrics(JsonRecord):
    """Scores of a model on one split.

    ``confusion[i][j]`` counts samples of true class ``i`` predicted as class ``j``; it has one row
    and column per class of the dataset.
    """

    accuracy: float
    macro_f1: float
    n: int
    confusion: tuple[tuple[int, ...], ...] | None = None
    #: ``recall[i]``: the share of class ``i``'s samples predicted as ``i`` (None for a class with no
    #: samples in the split); empty in reports written before it was recorded.
    recall: tuple[float | None, ...] = ()


@dataclass(frozen=True)
class ParameterCounts(JsonRecord):
    """Parameter counts of a model.

    ``attention`` covers the query, key, value and output-projection weights and biases of every
    layer (and DeBERTa's separate relative-position projections); ``heads_per_layer`` is the current
    head count of each layer.
    """

    total: int
    attention: int
    heads_per_layer: tuple[int, ...]


@dataclass(frozen=True)
class Latency(JsonRecord):
    """Forward-pass time of one input shape, over ``repeats`` timed runs after ``warmup`` untimed ones."""

    batch_size: int
    seq_len: int
    p50_ms: float
    p95_ms: float
    mean_ms: float
    throughput_per_s: float
    warmup: int
    repeats: int
    device: str
    #: The spread of the timed runs: their 25th and 75th percentiles (None in reports written before).
    p25_ms: float | None = None
    p75_ms: float | None = None


@dataclass(frozen=True)
class SpeedRow(JsonRecord):
    """Dense and pruned latency at one batch size; ``speedup`` is dense p50 / pruned p50.

    ``speedup_low`` and ``speedup_high`` bound its 95 % interval over the interleaved rounds (see
    :func:`cahp_engine.recovery.speedup_interval`); None in reports written before it was measured.
    """

    batch_size: int
    dense: Latency
    pruned: Latency
    speedup: float
    speedup_low: float | None = None
    speedup_high: float | None = None


@dataclass(frozen=True)
class SpeedComparison(JsonRecord):
    """A dense model and its pruned copy timed on the same random inputs, one row per batch size."""

    device: str
    seq_len: int
    warmup: int
    repeats: int
    results: tuple[SpeedRow, ...]

    def speedup_at(self, batch_size: int) -> float | None:
        """The speed-up at ``batch_size``, else at the first batch size measured, else None."""
        speedups = {row.batch_size: row.speedup for row in self.results}
        return speedups.get(batch_size, next(iter(speedups.values()), None))


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
class TrainingResult(JsonRecord):
    """What one fine-tuning run did.

    ``epochs`` is the number of passes over the data actually made (``steps`` over the batches of
    one epoch). ``loss_per_epoch`` and ``seconds_per_epoch`` have one entry per epoch begun, the
    last one possibly partial. ``precision`` is ``bf16``, ``fp16`` (with loss scaling) or ``fp32``.
    """

    steps: int
    epochs: float
    loss_per_epoch: tuple[float, ...]
    wall_s: float
    seconds_per_epoch: tuple[float, ...]
    device: str
    precision: str
    #: ``ce`` (cross-entropy with the labels) or ``distill`` (see :mod:`cahp_engine.recovery._distillation`).
    loss: str = "ce"
    #: The distillation loss's weight of the labels and its temperature (None for ``ce``).
    alpha: float | None = None
    temperature: float | None = None
    #: The teacher's pass over the training split (None for ``ce``).
    teacher: TeacherRecord | None = None
    #: Each class's weight in the loss (class-balanced recovery), None when every class weighs 1.
    class_weights: tuple[float, ...] | None = None
    #: The evaluations on the validation split, in order (the first before training); empty when the
    #: fine-tuning watched no validation split (the paper's fixed epochs).
    validation: tuple[ValidationPoint, ...] = ()
    #: The evaluation whose weights were kept and returned: its step and epoch (None without validation).
    best_step: int | None = None
    best_epoch: float | None = None
    #: True when ``early_stopping_patience`` evaluations in a row brought no gain and training stopped
    #: before its last step (or when an accuracy budget's search stopped it: see ``budget.candidates``).
    stopped_early: bool = False
    #: Evaluations without gain that stop the fine-tuning (0: never stops early).
    early_stopping_patience: int = 0


@dataclass(frozen=True)
class TeacherRecord(JsonRecord):
    """The teacher's logits over the training split: ``passes`` forward passes over ``rows`` rows."""

    passes: int
    rows: int
    seconds: float


@dataclass(frozen=True)
class SamplingRecord(JsonRecord):
    """How many training samples one pass of head selection read, and why it stopped there.

    ``mode`` is ``auto`` (a stopping rule decided) or ``fixed`` (an explicit amount, used exactly).
    ``stopped`` is ``converged`` (the rule was met), ``plateau`` (the noise share stopped falling
    before it was), ``cap`` (every row was read before either) or ``requested`` (a fixed amount).
    ``checkpoints`` are the sample counts at which the rule looked and ``measures`` its measure (the
    noise share) at each of them.
    """

    mode: str
    samples: int
    available: int
    stopped: str
    reason: str
    checkpoints: tuple[int, ...] = ()
    measures: tuple[float | None, ...] = ()


@dataclass(frozen=True)
class StabilityRecord(JsonRecord):
    """How much the selection depends on which samples were drawn (leave one shard out).

    The signature and calibration samples were accumulated in ``shards`` disjoint stratified shards;
    the cheap stages and the choice were rerun ``shards`` times, each without one shard.
    ``mean_jaccard`` and ``min_jaccard`` are over every pair of those head sets;
    ``jaccard_to_selection`` is the mean Jaccard of each of them with the run's selection;
    ``k_stars`` and ``heads_kept`` are per rerun; ``kept_frequency[l][h]`` is the share of reruns that
    kept head h of layer l; ``seconds`` what the reruns cost.
    """

    shards: int
    mean_jaccard: float
    min_jaccard: float
    jaccard_to_selection: float
    k_stars: tuple[int, ...]
    heads_kept: tuple[int, ...]
    kept_frequency: tuple[tuple[float, ...], ...]
    seconds: float


@dataclass(frozen=True)
class ConsensusRecord(JsonRecord):
    """How a consensus strategy combined the K + 1 analyses of one selection (the full one and K
    leave-one-shard-out ones) into its choice.

    ``method`` is the strategy (``coassociation``, ``stability-selection``, ``mean-distance``);
    ``runs`` is K + 1; ``k`` the number of clusters every run was cut at (the run's k*).
    ``mean_jaccard`` and ``min_jaccard`` are over every pair of CAHP's K + 1 single-run choices at
    ``k``: how much the runs agreed before the consensus; ``jaccard_to_single_run`` compares the
    consensus with CAHP's choice on the full analysis; ``kept_frequency[l][h]`` is the share of the
    K + 1 single-run choices that kept head h of layer l; ``seconds`` what the consensus cost (no
    sample is read again).
    """

    method: str
    runs: int
    k: int
    mean_jaccard: float
    min_jaccard: float
    jaccard_to_single_run: float
    kept_frequency: tuple[tuple[float, ...], ...]
    seconds: float


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
        not started again).
    cost_vs_single_run : float or None
        ``(search_seconds + final_recovery_seconds) / single`` where ``single`` is ``epochs`` at the
        candidates' median seconds per epoch: what the budget cost against one recovery at a knee.
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
