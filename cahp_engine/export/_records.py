"""The records of an ONNX export, its int8 copy and their timing: what ``report.json`` keeps under ``export``.

Plain typed data, importable without torch, onnx or onnxruntime (the report and the job service
read them); :mod:`cahp_engine.export` and :mod:`cahp_engine.export._runtime` produce them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cahp_engine.recovery import ClassificationMetrics, Latency
from cahp_engine.results import JsonRecord


@dataclass(frozen=True)
class Parity(JsonRecord):
    """How closely an ONNX graph reproduces the PyTorch model's logits.

    Attributes
    ----------
    max_abs_diff, mean_abs_diff : float
        Over every logit of every compared sample, each sample run padded on the right and on the left.
    prediction_agreement : float
        Share of those runs whose arg-max class is the same in both.
    threshold : float or None
        The tolerated ``max_abs_diff``; None when the comparison was only measured (int8).
    passed : bool
        ``max_abs_diff <= threshold`` (True without a threshold).
    samples : int
        Distinct samples compared.
    source : str
        ``"data"`` (rows drawn from the given split) or ``"generated"`` (random token ids).
    padding_sides : tuple of str
    """

    max_abs_diff: float
    mean_abs_diff: float
    prediction_agreement: float
    threshold: float | None
    passed: bool
    samples: int
    source: str
    padding_sides: tuple[str, ...]


@dataclass(frozen=True)
class OnnxExport(JsonRecord):
    """An exported directory and what was checked about it.

    ``heads_per_layer`` is None for a model family without a head adapter; ``neurons_per_layer`` is
    each layer's feed-forward size (None likewise; 0 where the block is skipped). ``exporter`` names the
    torch exporter; ``versions`` the ONNX stack's package versions. ``accuracy`` scores the graph in
    onnxruntime on the evaluation split, when a run gave one.
    """

    path: str
    model_file: str
    files: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    dynamic_axes: tuple[str, ...]
    opset: int
    num_labels: int
    heads_per_layer: tuple[int, ...] | None
    size_bytes: int
    export_s: float
    exporter: str
    versions: dict[str, str | None]
    parity: Parity | None
    accuracy: ClassificationMetrics | None = None
    neurons_per_layer: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Int8Export(JsonRecord):
    """A dynamically quantized copy of an exported graph.

    Weights of every matrix product with a constant operand are int8 (symmetric; per output channel
    when ``per_channel``), activations are quantized to uint8 at run time, per tensor. ``deviation``
    compares its logits with the PyTorch model's (measured, no threshold: int8 is not meant to be
    exact); ``accuracy`` scores it on the evaluation rows when they were given.
    """

    path: str
    model_file: str
    files: tuple[str, ...]
    per_channel: bool
    quantized_nodes: int
    size_bytes: int
    fp32_size_bytes: int
    quantize_s: float
    versions: dict[str, str | None]
    deviation: Parity | None
    accuracy: ClassificationMetrics | None


@dataclass(frozen=True)
class RuntimeLatencies(JsonRecord):
    """Latency of every candidate at one batch size.

    ``speedup[name]`` is the baseline's p50 over ``name``'s p50 (the baseline itself is 1.0);
    ``speedup_low[name]`` and ``speedup_high[name]`` bound its 95 % interval over the interleaved
    rounds (:func:`~cahp_engine.recovery.speedup_interval`; empty in reports written before).
    """

    batch_size: int
    latency: dict[str, Latency]
    speedup: dict[str, float]
    speedup_low: dict[str, float] = field(default_factory=dict)
    speedup_high: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class RuntimeSpeed(JsonRecord):
    """Latencies of onnxruntime graphs and PyTorch models timed together on the CPU.

    ``runtimes[name]`` says what ran a candidate, e.g. ``"onnxruntime 1.32.0"`` or ``"torch 2.13.0"``.
    """

    device: str
    seq_len: int
    warmup: int
    repeats: int
    threads: int
    baseline: str
    runtimes: dict[str, str]
    results: tuple[RuntimeLatencies, ...]


@dataclass(frozen=True)
class ExportRecord(JsonRecord):
    """``report.json``'s ``export``: the ONNX directory, its int8 copy, and onnxruntime timing.

    Attributes
    ----------
    onnx : OnnxExport or None
        ``onnx/`` (None with ``export="none"``).
    onnx_int8 : Int8Export or None
        ``onnx-int8/`` (None unless ``quantize="int8"``).
    speed : RuntimeSpeed or None
        A pruning run's one latency measurement: CPU latency of the dense and pruned models in PyTorch
        and onnxruntime (and int8), timed together; the baseline is the dense PyTorch model. With
        ``export="none"`` the two PyTorch models alone.
    """

    onnx: OnnxExport | None
    onnx_int8: Int8Export | None
    speed: RuntimeSpeed | None

    def speedup_at(self, candidate: str, batch_size: int = 32) -> float | None:
        """The baseline's p50 over ``candidate``'s at ``batch_size`` (None when not timed)."""
        row = self._row(batch_size)
        return None if row is None else row.speedup.get(candidate)

    def speedup_interval_at(self, candidate: str, batch_size: int = 32) -> tuple[float, float] | None:
        """The 95 % interval of :meth:`speedup_at` (None when not timed)."""
        row = self._row(batch_size)
        if row is None or candidate not in row.speedup_low or candidate not in row.speedup_high:
            return None
        return row.speedup_low[candidate], row.speedup_high[candidate]

    def _row(self, batch_size: int) -> RuntimeLatencies | None:
        if self.speed is None:
            return None
        return next((row for row in self.speed.results if row.batch_size == batch_size), None)


def describe_speedup(speedup: float | None, low: float | None = None, high: float | None = None) -> str:
    """A speed-up in words: ``"x1.85 (95 % interval x1.71-x2.02)"``, or ``"no measurable change"``.

    A speed-up whose interval holds 1 is inside its own measurement noise: it is reported as no
    measurable change (with the figures after it), never as a slowdown or a gain.
    """
    if speedup is None:
        return "not measured"
    if low is None or high is None:
        return f"x{speedup:.2f}"
    if low <= 1.0 <= high:
        return f"no measurable change (x{speedup:.2f}, 95 % interval x{low:.2f}-x{high:.2f})"
    return f"x{speedup:.2f} (95 % interval x{low:.2f}-x{high:.2f})"
