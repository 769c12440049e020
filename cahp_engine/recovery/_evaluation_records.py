"""What evaluating a classifier measures: its scores, its size, its speed.

Made by :mod:`cahp_engine.recovery._evaluation`; they go into the run report. Light: importable without torch or numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

from cahp_engine.results import JsonRecord


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
