"""What a run pruned to a speed or FLOPs target did: the record in ``report.json`` and its console lines.

Light: importable without torch or numpy, as the rest of the run report (:mod:`cahp_engine.run._report`).
"""

from __future__ import annotations

from dataclasses import dataclass

from cahp_engine.results import JsonRecord

#: ``target_runtime`` (the user's name) -> the runtime :func:`cahp_engine.allocation.prune_to_target` times on.
ENGINE_RUNTIMES = {"pytorch": "pytorch", "ort-fp32": "onnxruntime", "ort-int8": "onnxruntime-int8"}


@dataclass(frozen=True)
class TargetRecord(JsonRecord):
    """The allocation of a target run, what it predicted and what it measured.

    Attributes
    ----------
    kind : {"speedup", "flops"}
        Which target was set.
    target : float
        ``target_speedup`` (x dense), or ``target_flops`` (a fraction of the dense encoder's FLOPs).
    runtime : str
        ``target_runtime`` as the user named it (``pytorch``, ``ort-fp32``, ``ort-int8``); ``analytic``
        for a FLOPs target, which is counted, not timed.
    batch_size, seq_len : int
        The serving shape the costs were fitted and the speed-up measured at (``seq_len``: resolved
        from ``p95`` when asked).
    heads_total, neurons_total : int
        Heads and feed-forward neurons of one dense layer.
    heads_per_layer, neurons_per_layer : tuple of int
        Kept in each layer; 0 means the sub-layer is skipped.
    head_strategy : str
        The strategy that chose which heads each layer keeps, within the allocation's counts.
    importance : str
        How every head and neuron was scored for the allocation (``fisher``).
    calibration_rows : int
        Training rows the importance (and the serving length) were computed from.
    flops_kept : float
        The pruned encoder's FLOPs over the dense one's, at ``batch_size`` x ``seq_len``.
    predicted_speedup : float
        The cost model's prediction (latency table for a speed target, FLOPs for a FLOPs target).
    reachable_speedup : float
        The most the cost model predicts any allocation reaches (one head and one neuron per layer).
    measured_speedup : float or None
        Dense over pruned median latency, timed in the same run on ``runtime``; None for a FLOPs target.
    dense_ms, pruned_ms : float or None
        Those medians, in milliseconds.
    corrections : int
        Times the allocation was aimed again because the measurement fell below the target or more than 4 %
        above it.
    cost_unit : str
        ``seconds`` (a fitted latency table) or ``flops``.
    fit_error : float
        The latency table's largest relative error on the shapes it was fitted on (0 for FLOPs).
    seconds : float
        Importance, costs, allocation, surgery and timing, in all.
    """

    kind: str
    target: float
    runtime: str
    batch_size: int
    seq_len: int
    heads_total: int
    neurons_total: int
    heads_per_layer: tuple[int, ...]
    neurons_per_layer: tuple[int, ...]
    head_strategy: str
    importance: str
    calibration_rows: int
    flops_kept: float
    predicted_speedup: float
    reachable_speedup: float
    measured_speedup: float | None
    dense_ms: float | None
    pruned_ms: float | None
    corrections: int
    cost_unit: str
    fit_error: float
    seconds: float

    @property
    def met(self) -> bool | None:
        """Whether the measured speed-up is at or above the target (None for a FLOPs target)."""
        if self.measured_speedup is None:
            return None
        return self.measured_speedup >= self.target

    def shortfall(self) -> str | None:
        """The warning of a speed target the pruned model measured below, naming what to change (None when met,
        and for a FLOPs target)."""
        if self.met is not False:
            return None
        assert self.measured_speedup is not None
        timing = (f" ({self.dense_ms:.1f} -> {self.pruned_ms:.1f} ms)"
                  if self.dense_ms is not None and self.pruned_ms is not None else "")
        return (f"the speed target x{self.target:g} was not met: the pruned model measured "
                f"x{self.measured_speedup:.2f} on {self.runtime} at batch {self.batch_size} x {self.seq_len} "
                f"tokens{timing} after {self.corrections} correction(s); run it on a machine less busy than this "
                f"one, or ask for at most x{self.measured_speedup:.2f}")

    def headline(self) -> str:
        """One line: the target, FLOPs kept, predicted and measured speed-up."""
        shape = f"batch {self.batch_size} x {self.seq_len} tokens"
        if self.kind == "flops":
            return (f"FLOPs target {self.target:g}: kept {self.flops_kept:.1%} of the encoder's FLOPs at {shape} "
                    f"(x{self.predicted_speedup:.2f} fewer; reachable x{self.reachable_speedup:.2f})")
        measured = f"measured x{self.measured_speedup:.2f}" if self.measured_speedup is not None else "not measured"
        timing = (f" ({self.dense_ms:.1f} -> {self.pruned_ms:.1f} ms)"
                  if self.dense_ms is not None and self.pruned_ms is not None else "")
        miss = "" if self.met is not False else " - BELOW the target"
        return (f"speed target x{self.target:g} on {self.runtime} at {shape}: predicted "
                f"x{self.predicted_speedup:.2f}, {measured}{timing}{miss}; FLOPs kept {self.flops_kept:.1%}; "
                f"reachable x{self.reachable_speedup:.2f}")

    def layer_lines(self) -> list[str]:
        """A table of the heads and neurons each layer keeps, one line a layer."""
        lines = [f"layer  heads (of {self.heads_total})  neurons (of {self.neurons_total})"]
        for layer, (heads, neurons) in enumerate(zip(self.heads_per_layer, self.neurons_per_layer, strict=True)):
            skipped = [name for name, kept in (("attention", heads), ("feed-forward", neurons)) if kept == 0]
            note = f"  ({' and '.join(skipped)} skipped)" if skipped else ""
            lines.append(f"{layer:>5}  {heads:>5} {_bar(heads, self.heads_total)}  "
                         f"{neurons:>6} {_bar(neurons, self.neurons_total)}{note}")
        return lines


def _bar(kept: int, total: int, width: int = 10) -> str:
    filled = round(width * kept / total) if total else 0
    return "#" * filled + "." * (width - filled)
