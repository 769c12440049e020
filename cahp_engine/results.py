"""Small frozen records of what a stage measured, JSON-ready both ways; importable without torch or numpy.

:class:`ClassificationMetrics`, :class:`ParameterCounts` and :class:`Latency` /
:class:`SpeedComparison` come from :mod:`cahp_engine.recovery._evaluation`, :class:`TrainingResult` from
:mod:`cahp_engine.recovery._training`, and all of them go into the run report (:mod:`cahp_engine.run._report`).
Each has ``to_dict()`` (plain JSON types: lists for tuples, string keys) and ``from_dict()``, its
inverse, both derived from the field types by :class:`JsonRecord`.
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


@dataclass(frozen=True)
class SpeedRow(JsonRecord):
    """Dense and pruned latency at one batch size; ``speedup`` is dense p50 / pruned p50."""

    batch_size: int
    dense: Latency
    pruned: Latency
    speedup: float


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
    ``stopped`` is ``converged`` (the rule was met), ``cap`` (every row was read before it was) or
    ``requested`` (a fixed amount). ``checkpoints`` are the sample counts at which the rule looked and
    ``measures`` its measure (the noise share) at each of them.
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
class BudgetCandidate(JsonRecord):
    """One head count the accuracy budget tried, scored on the validation split.

    ``k`` clusters keep ``heads_kept`` heads; ``*_before`` is the pruned model before recovery,
    ``*_after`` after ``screen_epochs`` of recovery; ``within_budget`` compares ``after`` on the
    budget's metric with the threshold; ``seconds`` is the candidate's pruning, recovery and scoring.
    ``accuracy_final`` / ``macro_f1_final`` are the chosen candidate's scores after the full recovery
    (None for the others, and when the screening already was the full recovery).
    """

    k: int
    heads_kept: int
    accuracy_before: float
    macro_f1_before: float
    accuracy_after: float
    macro_f1_after: float
    screen_epochs: float
    within_budget: bool
    seconds: float
    accuracy_final: float | None = None
    macro_f1_final: float | None = None


@dataclass(frozen=True)
class BudgetRecord(JsonRecord):
    """The accuracy-budget search (:mod:`cahp_engine.run._budget`; kept here, beside the other measured records, so that
    :class:`~cahp_engine.errors.AccuracyBudgetError` can carry it).

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
    candidates : tuple of BudgetCandidate
        In the order tried (fewest heads first); the search stops at the first within the budget.
    chosen : int or None
        ``heads_kept`` of the candidate returned (None when none met the budget).
    search_seconds : float
        Every candidate's pruning, screening recovery and scoring.
    final_recovery_seconds : float
        The chosen candidate's full recovery (0 when the screening was the full recovery).
    cost_vs_single_run : float or None
        ``(search_seconds + final_recovery_seconds) / single`` where ``single`` is the recovery of one
        candidate with ``epochs`` (measured, or estimated from the screening time per epoch): what
        the budget cost against a run at the knee.
    """

    max_accuracy_drop: float
    metric: str
    split: str
    carved: bool
    validation_rows: int
    dense_validation: float
    threshold: float
    candidates: tuple[BudgetCandidate, ...]
    chosen: int | None
    search_seconds: float
    final_recovery_seconds: float
    cost_vs_single_run: float | None
