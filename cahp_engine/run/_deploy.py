"""The deployable copies of a pruned model: ONNX (checked against PyTorch), optional int8, one speed measurement, cards.

After the checkpoint is written, :func:`export_for_deployment` writes ``onnx/`` (and with
``quantize="int8"`` ``onnx-int8/``) next to ``model/``, scores the ONNX graph on the evaluation split,
and makes the run's one latency measurement: the dense and pruned models in PyTorch and every graph,
timed together on the CPU in interleaved rounds (median, spread and each speed-up's interval). The
report's ``speed``, its summary, the cards and the console all quote that one measurement.
:func:`write_cards` puts a ``README.md`` model card in each directory, each quoting its own graph's
parity and scores. A graph whose logits differ from PyTorch's by more than 1e-4 fails the run with
``export_parity_failed`` before anything is kept.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from cahp_engine.data import EncodedDataset
from cahp_engine.export import (
    ExportRecord,
    ModelCardInputs,
    RuntimeSpeed,
    SpeedFigure,
    compare_runtimes,
    evaluate_onnx,
    export_onnx,
    quantize_int8,
    write_model_card,
)
from cahp_engine.recovery import SpeedComparison, SpeedRow
from cahp_engine.run._steps import Inputs, RunContext

#: Directories written next to ``model/`` (when the run asks for them).
ONNX_DIR, INT8_DIR = "onnx", "onnx-int8"
#: Names of the candidates timed by :func:`export_for_deployment`; speed-ups are relative to the first.
TORCH_DENSE, TORCH_PRUNED, ONNX_DENSE, ONNX_PRUNED, INT8_PRUNED = (
    "torch_dense", "torch_pruned", "onnx_dense", "onnx_pruned", "onnx_int8_pruned")
#: Batch sizes timed; the summary's speed-ups are at the last.
BATCH_SIZES = (1, 32)
_LABELS = {TORCH_DENSE: ("PyTorch", "dense"), TORCH_PRUNED: ("PyTorch", "pruned"),
           ONNX_DENSE: ("onnxruntime", "dense"), ONNX_PRUNED: ("onnxruntime", "pruned"),
           INT8_PRUNED: ("onnxruntime int8", "pruned")}
#: The timed candidate each card describes.
_CARD_CANDIDATE = {"pytorch": TORCH_PRUNED, "onnx": ONNX_PRUNED, "onnx-int8": INT8_PRUNED}

#: What each of the export's steps took, in seconds, in the order they run: the pruned graph written,
#: its parity check, its scoring, the int8 model (quantized, checked and scored), the dense graph
#: written, the latency rounds (two PyTorch models and two graphs, batch sizes 1 and 32, 3 warm-up and
#: 20 timed passes). Measured on the real all-MiniLM-L6-v2 with 400 SST-5 test rows (the shape of
#: ``python -m bench eta``'s job), 1 thread at nice 10, 2026-12-05, load average 4.0 (int8: 5.1, in a
#: second run, whose latency rounds with the int8 graph as a fifth candidate took 104 s; an int8 run's
#: rounds weigh more than this table gives them). A real job's trace shows what they take there
#: (docs/performance.md, "The time left").
#: The export reports its progress as the share of these its steps have done (within the scoring and
#: the latency rounds, as they go), so that a job's progress moves during the export and its time left
#: is measured on the export's own rate rather than counted down from other stages' speed.
EXPORT_STEP_COST: dict[str, float] = {
    "onnx": 9.6,
    "parity": 5.0,
    "scoring": 4.6,
    "int8": 10.0,
    "dense_onnx": 8.0,
    "latency": 49.6,
}


class ExportSteps:
    """The export stage's progress: each of ``steps`` given its share of the stage in proportion to
    :data:`EXPORT_STEP_COST`, told to ``report(stage, fraction)`` as each ends or moves."""

    def __init__(self, report: Callable[[str, float], None], steps: Sequence[str], stage: str = "export") -> None:
        total = sum(EXPORT_STEP_COST[step] for step in steps) or 1.0
        self._report, self._stage, self._spans, at = report, stage, {}, 0.0
        for step in steps:
            self._spans[step] = (at / total, (at + EXPORT_STEP_COST[step]) / total)
            at += EXPORT_STEP_COST[step]

    def done(self, step: str) -> None:
        """``step`` is over."""
        self._report(self._stage, self._spans[step][1])

    def part(self, step: str) -> Callable[[int, int], None]:
        """A ``progress(done, total)`` callback for the work within ``step``."""
        lo, hi = self._spans[step]
        return lambda done, total: self._report(self._stage, lo + (hi - lo) * min(1.0, done / max(total, 1)))


def latency_seq_len(evaluation: EncodedDataset) -> int:
    """The length latency is measured at: the evaluation split's 95th-percentile length, within [8, 64]."""
    return int(min(64, max(8, np.percentile(evaluation.lengths, 95))))


def export_for_deployment(run: RunContext, *, work: Path, dense: nn.Module, pruned: nn.Module,
                          inputs: Inputs) -> ExportRecord:
    """Write ``onnx/`` (and ``onnx-int8/``) under ``work``, score them, and time every model once.

    The graphs take ``inputs``' tokenizer and are scored on its evaluation split. Parity is checked on
    up to 64 evaluation rows, each padded right and left. The timing uses the protocol of
    :func:`~cahp_engine.export.compare_runtimes` at :func:`latency_seq_len`, batch sizes 1 and 32, on
    the CPU with torch's thread count; the dense model is exported to a temporary directory for it.
    With ``export="none"`` nothing is written and only the two PyTorch models are timed.

    Raises
    ------
    ExportParityError
        When the pruned graph's logits differ from PyTorch's by more than 1e-4.
    """
    config, tokenizer, evaluation = run.config, inputs.loaded.tokenizer, inputs.evaluation
    seq_len = latency_seq_len(evaluation)

    def timed(graphs: dict[str, Path], progress: Callable[[int, int], None] | None = None) -> RuntimeSpeed:
        return compare_runtimes(graphs, torch_models={TORCH_DENSE: dense, TORCH_PRUNED: pruned}, baseline=TORCH_DENSE,
                                batch_sizes=BATCH_SIZES, seq_len=seq_len, warmup=config.latency_warmup,
                                repeats=config.latency_repeats, seed=config.seed, progress=progress)

    if config.export == "none":
        with run.monitor.stage("evaluation"):
            run.say("timing the dense and pruned models together on the CPU, in interleaved rounds")
            return ExportRecord(onnx=None, onnx_int8=None, speed=timed({}))
    with run.monitor.stage("export"):
        steps = ExportSteps(run.monitor.report, [step for step in EXPORT_STEP_COST
                                                 if step != "int8" or config.quantize == "int8"])
        run.say("exporting the pruned model to ONNX and checking it against PyTorch")
        onnx = export_onnx(pruned, tokenizer, work / ONNX_DIR, data=evaluation, seed=config.seed,
                           exported=lambda: steps.done("onnx"))
        steps.done("parity")
        parity = onnx.parity
        if parity is not None:
            run.say(f"ONNX parity: max |logit difference| {parity.max_abs_diff:.2e} on {parity.samples} samples")
        scored = evaluate_onnx(work / ONNX_DIR, evaluation, batch_size=config.batch_size,
                               progress=steps.part("scoring"))
        onnx = dataclasses.replace(onnx, accuracy=scored)
        int8 = None
        if config.quantize == "int8":
            run.say("quantizing the ONNX model to int8 (dynamic, per output channel)")
            int8 = quantize_int8(work / ONNX_DIR, work / INT8_DIR, model=pruned, parity_data=evaluation,
                                 eval_data=evaluation, per_channel=True, seed=config.seed)
            steps.done("int8")
        run.say("timing PyTorch and onnxruntime together on the CPU, in interleaved rounds")
        with tempfile.TemporaryDirectory(prefix="cahp-dense-onnx-") as scratch:
            export_onnx(dense, tokenizer, Path(scratch) / ONNX_DIR, check=False, seed=config.seed)
            steps.done("dense_onnx")
            graphs = {ONNX_DENSE: Path(scratch) / ONNX_DIR, ONNX_PRUNED: work / ONNX_DIR}
            if int8 is not None:
                graphs[INT8_PRUNED] = work / INT8_DIR
            speed = timed(graphs, steps.part("latency"))
    # Paths relative to the run's output, so the report names no directory of the machine.
    record = ExportRecord(
        onnx=dataclasses.replace(onnx, path=ONNX_DIR),
        onnx_int8=dataclasses.replace(int8, path=INT8_DIR) if int8 is not None else None,
        speed=speed,
    )
    cpu = record.speedup_at(ONNX_PRUNED)
    run.say(f"onnxruntime (CPU, batch 32): pruned x{cpu:.2f} against dense PyTorch" if cpu else "onnxruntime timed")
    return record


def torch_speed(export: ExportRecord) -> SpeedComparison:
    """The PyTorch dense-and-pruned rows of the run's one measurement, as the report's ``speed``."""
    speed = export.speed
    assert speed is not None  # export_for_deployment always times
    rows = tuple(
        SpeedRow(batch_size=row.batch_size, dense=row.latency[TORCH_DENSE], pruned=row.latency[TORCH_PRUNED],
                 speedup=row.speedup[TORCH_PRUNED], speedup_low=row.speedup_low.get(TORCH_PRUNED),
                 speedup_high=row.speedup_high.get(TORCH_PRUNED))
        for row in speed.results
    )
    return SpeedComparison(device=speed.device, seq_len=speed.seq_len, warmup=speed.warmup, repeats=speed.repeats,
                           results=rows)


def card_inputs(report: Any, variant: str = "pytorch") -> ModelCardInputs:
    """The facts of the model card of one directory (``pytorch``: ``model/``), from a finished report."""
    summary, selection, export, metrics = report.summary, report.selection, report.export, report.metrics
    identity, layers, heads = report.identity, report.model.layers, report.model.heads_per_layer
    target = getattr(report, "target", None)
    kept = tuple(tuple(selection.kept.get(layer, ())) for layer in range(layers))
    int8 = export.onnx_int8
    int8_metrics = int8.accuracy if int8 is not None else None
    own = _own_parity(report, variant)
    recall = {"dense": metrics.dense.recall, "pruned": metrics.pruned.recall}
    if int8_metrics is not None:
        recall["ONNX int8"] = int8_metrics.recall
    return ModelCardInputs(
        family=report.model.family, num_layers=layers, num_heads=heads, kept_heads=kept,
        base_model=identity.base_model if identity else report.model.ref,
        base_model_hub_id=identity.base_model_hub_id if identity else None,
        dataset=identity.dataset if identity else report.dataset.ref,
        dataset_hub_id=identity.dataset_hub_id if identity else None,
        eval_split=report.dataset.eval_split,
        label_names=tuple(report.dataset.label_names), strategy=selection.strategy, k_star=summary.k_star,
        # A target's allocation set the head count, not a knee: no degree; its neurons per layer in the table.
        poly_degree=selection.poly_degree if target is None else None, dense_accuracy=summary.dense_accuracy,
        accuracy_before_recovery=report.metrics.pruned_before_recovery.accuracy,
        pruned_accuracy=summary.pruned_accuracy, onnx_accuracy=summary.onnx_accuracy,
        int8_accuracy=summary.int8_accuracy, dense_macro_f1=metrics.dense.macro_f1,
        pruned_macro_f1=metrics.pruned.macro_f1, onnx_macro_f1=summary.onnx_macro_f1,
        int8_macro_f1=summary.int8_macro_f1, recall={k: tuple(v) for k, v in recall.items() if v},
        dense_parameters=report.parameters.dense.total, pruned_parameters=report.parameters.pruned.total,
        speed=_speed_figures(export, _CARD_CANDIDATE[variant]), onnx_max_abs_diff=summary.onnx_max_abs_diff,
        variant=variant, parity_max_abs_diff=own[0], parity_agreement=own[1],
        model_name=identity.name if identity else None, job_id=identity.job_id if identity else None,
        labels=dict(identity.labels) if identity else {}, cahp_version=identity.cahp_version if identity else None,
        recipe=report.recipe.lines() if report.recipe is not None else (), warnings=tuple(summary.warnings),
        neurons_per_layer=() if target is None else target.neurons_per_layer,
        num_neurons=None if target is None else target.neurons_total,
    )


def _own_parity(report: Any, variant: str) -> tuple[float | None, float | None]:
    """The parity of the directory a card describes: its graph's, or the reloaded checkpoint's."""
    export = report.export
    if variant == "onnx-int8":
        deviation = export.onnx_int8.deviation if export.onnx_int8 is not None else None
        return (deviation.max_abs_diff, deviation.prediction_agreement) if deviation else (None, None)
    if variant == "onnx":
        parity = export.onnx.parity if export.onnx is not None else None
        return (parity.max_abs_diff, parity.prediction_agreement) if parity else (None, None)
    return report.checkpoint.max_abs_logit_diff_after_reload, None


def _speed_figures(export: ExportRecord, current: str) -> tuple[SpeedFigure, ...]:
    if export.speed is None:
        return ()
    figures: list[SpeedFigure] = []
    for row in export.speed.results:
        for name, latency in row.latency.items():
            runtime, model = _LABELS.get(name, (name, ""))
            baseline = name == export.speed.baseline
            figures.append(SpeedFigure(
                runtime=runtime, model=f"{model} (baseline)" if baseline else model, batch_size=row.batch_size,
                seq_len=export.speed.seq_len, p50_ms=latency.p50_ms,
                speedup=None if baseline else row.speedup.get(name), speedup_low=row.speedup_low.get(name),
                speedup_high=row.speedup_high.get(name), p25_ms=latency.p25_ms, p75_ms=latency.p75_ms,
                current=name == current))
    return tuple(figures)


def write_cards(work: Path, report: Any) -> None:
    """``README.md`` in ``model/`` and in every exported directory, each card describing its own directory."""
    write_model_card(card_inputs(report, "pytorch"), [work / "model"])
    for directory, variant in ((ONNX_DIR, "onnx"), (INT8_DIR, "onnx-int8")):
        if (work / directory).is_dir():
            write_model_card(card_inputs(report, variant), [work / directory])
