"""The deployable copies of a pruned model: ONNX (checked against PyTorch), optional int8, model cards.

After the checkpoint is written, :func:`export_for_deployment` writes ``onnx/`` (and with
``quantize="int8"`` ``onnx-int8/``) next to ``model/``, times the dense and pruned models in PyTorch and
onnxruntime together on the CPU, and :func:`write_cards` puts a ``README.md`` model card in each
directory. A graph whose logits differ from PyTorch's by more than 1e-4 fails the run with
``export_parity_failed`` before anything is kept.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any

from torch import nn

from cahp_engine.data import EncodedDataset
from cahp_engine.export import (
    ExportRecord,
    ModelCardInputs,
    SpeedFigure,
    compare_runtimes,
    export_onnx,
    quantize_int8,
    write_model_card,
)
from cahp_engine.run._steps import RunContext

#: Directories written next to ``model/`` (when the run asks for them).
ONNX_DIR, INT8_DIR = "onnx", "onnx-int8"
#: Names of the candidates timed by :func:`export_for_deployment`; speed-ups are relative to the first.
TORCH_DENSE, TORCH_PRUNED, ONNX_DENSE, ONNX_PRUNED, INT8_PRUNED = (
    "torch_dense", "torch_pruned", "onnx_dense", "onnx_pruned", "onnx_int8_pruned")


def export_for_deployment(
    run: RunContext,
    *,
    work: Path,
    dense: nn.Module,
    pruned: nn.Module,
    tokenizer: Any,
    evaluation: EncodedDataset,
    seq_len: int,
) -> ExportRecord:
    """Write ``onnx/`` (and ``onnx-int8/``) under ``work`` and time them; nothing with ``export="none"``.

    Parity is checked on up to 64 evaluation rows, each padded right and left. The timing uses the
    protocol of :func:`~cahp_engine.recovery.compare_speed` at ``seq_len``, batch sizes 1 and 32, on
    the CPU with torch's thread count; the dense model is exported to a temporary directory for it.

    Raises
    ------
    ExportParityError
        When the pruned graph's logits differ from PyTorch's by more than 1e-4.
    """
    config = run.config
    if config.export == "none":
        return ExportRecord(onnx=None, onnx_int8=None, speed=None)
    with run.monitor.stage("export"):
        run.say("exporting the pruned model to ONNX and checking it against PyTorch")
        onnx = export_onnx(pruned, tokenizer, work / ONNX_DIR, data=evaluation, seed=config.seed)
        parity = onnx.parity
        if parity is not None:
            run.say(f"ONNX parity: max |logit difference| {parity.max_abs_diff:.2e} on {parity.samples} samples")
        int8 = None
        if config.quantize == "int8":
            run.say("quantizing the ONNX model to int8 (dynamic, per output channel)")
            int8 = quantize_int8(work / ONNX_DIR, work / INT8_DIR, model=pruned, parity_data=evaluation,
                                 eval_data=evaluation, per_channel=True, seed=config.seed)
        with tempfile.TemporaryDirectory(prefix="cahp-dense-onnx-") as scratch:
            export_onnx(dense, tokenizer, Path(scratch) / ONNX_DIR, check=False, seed=config.seed)
            graphs = {ONNX_DENSE: Path(scratch) / ONNX_DIR, ONNX_PRUNED: work / ONNX_DIR}
            if int8 is not None:
                graphs[INT8_PRUNED] = work / INT8_DIR
            speed = compare_runtimes(graphs, torch_models={TORCH_DENSE: dense, TORCH_PRUNED: pruned},
                                     baseline=TORCH_DENSE, seq_len=seq_len, warmup=config.latency_warmup,
                                     repeats=config.latency_repeats, seed=config.seed)
    # Paths relative to the run's output, so the report names no directory of the machine.
    record = ExportRecord(
        onnx=dataclasses.replace(onnx, path=ONNX_DIR),
        onnx_int8=dataclasses.replace(int8, path=INT8_DIR) if int8 is not None else None,
        speed=speed,
    )
    cpu = record.speedup_at(ONNX_PRUNED)
    run.say(f"onnxruntime (CPU, batch 32): pruned x{cpu:.2f} against dense PyTorch" if cpu else "onnxruntime timed")
    return record


def card_inputs(report: Any) -> ModelCardInputs:
    """The model card's facts, from a finished :class:`~cahp_engine.run.RunReport`."""
    summary, selection, export = report.summary, report.selection, report.export
    layers, heads = report.model.layers, report.model.heads_per_layer
    kept = tuple(tuple(selection.kept.get(layer, ())) for layer in range(layers))
    figures: list[SpeedFigure] = []
    if export.speed is not None:
        labels = {TORCH_DENSE: ("PyTorch", "dense"), TORCH_PRUNED: ("PyTorch", "pruned"),
                  ONNX_DENSE: ("onnxruntime", "dense"), ONNX_PRUNED: ("onnxruntime", "pruned"),
                  INT8_PRUNED: ("onnxruntime int8", "pruned")}
        for row in export.speed.results:
            for name, latency in row.latency.items():
                runtime, model = labels.get(name, (name, ""))
                figures.append(SpeedFigure(runtime=runtime, model=model, batch_size=row.batch_size,
                                           seq_len=export.speed.seq_len, p50_ms=latency.p50_ms,
                                           speedup=row.speedup.get(name)))
    return ModelCardInputs(
        family=report.model.family, num_layers=layers, num_heads=heads, kept_heads=kept,
        base_model=report.model.ref, dataset=report.dataset.ref, eval_split=report.dataset.eval_split,
        label_names=tuple(report.dataset.label_names), strategy=selection.strategy, k_star=summary.k_star,
        poly_degree=selection.poly_degree, dense_accuracy=summary.dense_accuracy,
        accuracy_before_recovery=report.metrics.pruned_before_recovery.accuracy,
        pruned_accuracy=summary.pruned_accuracy, int8_accuracy=summary.int8_accuracy,
        dense_parameters=report.parameters.dense.total, pruned_parameters=report.parameters.pruned.total,
        speed=tuple(figures), onnx_max_abs_diff=summary.onnx_max_abs_diff,
    )


def write_cards(work: Path, report: Any) -> None:
    """``README.md`` in ``model/`` and in every exported directory."""
    directories = [work / "model"] + [work / d for d in (ONNX_DIR, INT8_DIR) if (work / d).is_dir()]
    write_model_card(card_inputs(report), directories)
