"""``cahp export``: a checked ONNX (or int8 ONNX) directory from a saved pruned checkpoint.

:func:`export_checkpoint` loads a directory written by ``cahp prune`` (or
:func:`cahp_engine.models.save_pruned`, or any supported unpruned checkpoint), exports it with
:func:`cahp_engine.export.export_onnx`, checks parity on the dataset's evaluation rows when a dataset
is given (else on random token ids), quantizes it for ``onnx-int8``, scores and times it, and writes
a model card. Like a pruning run it writes into a hidden sibling directory renamed to the output only
when everything succeeded.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cahp_engine._output_dir import prepare_output_dir, staged_output
from cahp_engine.data import DatasetOptions, EncodedDataset, encode, load_splits
from cahp_engine.errors import ConfigError, DatasetError, ModelLoadError
from cahp_engine.export import export_onnx
from cahp_engine.export._card_facts import ModelCardInputs, SpeedFigure
from cahp_engine.export._int8 import quantize_int8
from cahp_engine.export._model_card import write_model_card
from cahp_engine.export._onnx import PARITY_SAMPLES
from cahp_engine.export._records import Int8Export, OnnxExport, Parity, RuntimeSpeed
from cahp_engine.export._runtime import compare_runtimes, evaluate_onnx
from cahp_engine.models import (
    DEFAULT_MAX_MODEL_PARAMS,
    current_kept_heads,
    get_adapter,
    heads_per_layer,
    load_classifier,
    neuron_record,
    neurons_per_layer,
)
from cahp_engine.recovery import ClassificationMetrics, count_parameters, evaluate
from cahp_engine.results import JsonRecord

#: What ``--format`` accepts.
EXPORT_FORMATS: tuple[str, ...] = ("onnx", "onnx-int8")
_TORCH = "pytorch"


@dataclass(frozen=True)
class CheckpointExport(JsonRecord):
    """What ``cahp export`` wrote and measured.

    Attributes
    ----------
    format : ``"onnx"`` or ``"onnx-int8"``
    checkpoint, output : the source directory and the written one
    family, heads_per_layer, parameters : the model as loaded
    parity : the fp32 graph against the PyTorch model (threshold enforced)
    onnx : the fp32 export; for ``onnx-int8`` an intermediate that is not kept (its ``path`` is empty)
    int8 : the quantized export, for ``onnx-int8``
    dataset, eval_split : where the parity rows and accuracies came from, when a dataset was given
    accuracy : ``{"pytorch": ..., format: ...}`` on the evaluation split, when a dataset was given
    speed : CPU latency of the PyTorch model and the export(s), baseline ``"pytorch"``; None when skipped
    wall_s : float
    """

    format: str
    checkpoint: str
    output: str
    family: str
    heads_per_layer: tuple[int, ...]
    parameters: int
    parity: Parity
    onnx: OnnxExport
    int8: Int8Export | None
    dataset: str | None
    eval_split: str | None
    accuracy: dict[str, ClassificationMetrics] | None
    speed: RuntimeSpeed | None
    wall_s: float


def export_checkpoint(
    checkpoint: str | Path,
    output_dir: str | Path,
    *,
    fmt: str = "onnx",
    dataset: str | None = None,
    dataset_options: DatasetOptions | None = None,
    overwrite: bool = False,
    samples: int = PARITY_SAMPLES,
    seed: int = 0,
    max_length: int = 512,
    latency_repeats: int = 20,
    latency_warmup: int = 3,
    max_model_params: int = DEFAULT_MAX_MODEL_PARAMS,
    log: Callable[[str], None] | None = None,
) -> CheckpointExport:
    """Export the checkpoint directory ``checkpoint`` to ``output_dir`` in format ``fmt``.

    Parameters
    ----------
    checkpoint : directory with ``config.json``, ``model.safetensors`` and the tokenizer
    output_dir : must not exist or be empty (unless ``overwrite``); receives ``model.onnx``,
        ``config.json``, the tokenizer files and ``README.md``
    fmt : ``"onnx"`` (float32) or ``"onnx-int8"`` (dynamic int8, per-channel weights)
    dataset : a dataset directory or hub id, optional
        Its evaluation split (``dataset_options.eval_split``) gives the parity rows and the accuracies.
    samples, seed : parity sample count and seed
    max_length : tokenizer truncation for the dataset's rows
    latency_repeats, latency_warmup : timed and untimed passes per candidate; 0 repeats skips timing
    max_model_params : most parameters the checkpoint's architecture may have (before pruning); checked,
        with its weights' names and shapes, before the model is allocated

    Raises
    ------
    InvalidInputError
        For a bad format, output, checkpoint or dataset.
    ExportParityError
        If the fp32 graph does not reproduce the PyTorch logits; nothing is written to ``output_dir``.
    """
    started = time.perf_counter()
    say = log or (lambda _line: None)
    if fmt not in EXPORT_FORMATS:
        raise ConfigError(f"`format` must be one of {', '.join(EXPORT_FORMATS)}, got {fmt!r}")
    if isinstance(latency_repeats, bool) or not isinstance(latency_repeats, int) or latency_repeats < 0:
        raise ConfigError(f"`latency_repeats` must be an integer >= 0, got {latency_repeats!r}")
    source = Path(checkpoint).expanduser()
    if not source.is_dir():
        raise ModelLoadError(f"checkpoint directory {str(source)!r} does not exist; pass a directory written by "
                             "cahp prune (its model/ folder) or save_pruned")
    out = Path(output_dir).expanduser().resolve()
    prepare_output_dir(out, overwrite=overwrite)

    say(f"loading {source}")
    loaded = load_classifier(str(source), max_params=max_model_params)
    model, tokenizer = loaded.model, loaded.tokenizer
    rows, eval_split = _evaluation_rows(model, tokenizer, dataset, dataset_options or DatasetOptions(), max_length)

    with staged_output(out) as stage:
        with tempfile.TemporaryDirectory(prefix="cahp-onnx-fp32-") as scratch:
            fp32_dir = stage if fmt == "onnx" else Path(scratch)
            say(f"exporting to ONNX; parity on {'the evaluation rows' if rows is not None else 'random token ids'}")
            onnx_export = export_onnx(model, tokenizer, fp32_dir, data=rows, samples=samples, seed=seed)
            assert onnx_export.parity is not None  # check=True always measures it
            int8 = None
            if fmt == "onnx-int8":
                say("quantizing to int8")
                int8 = quantize_int8(fp32_dir, stage, model=model, parity_data=rows, eval_data=rows,
                                     per_channel=True, samples=samples, seed=seed)
            accuracy = _accuracies(model, stage, rows, fmt, int8)
            speed = None
            if latency_repeats > 0:
                say("timing PyTorch and onnxruntime on the CPU")
                graphs = {"onnx": fp32_dir} | ({"onnx-int8": stage} if int8 is not None else {})
                speed = compare_runtimes(graphs, torch_models={_TORCH: model}, baseline=_TORCH,
                                         seq_len=_speed_length(rows), warmup=latency_warmup,
                                         repeats=latency_repeats, seed=seed)
        config: Any = model.config
        adapter = get_adapter(model)
        own = int8.deviation if int8 is not None else onnx_export.parity
        write_model_card(
            ModelCardInputs(
                family=loaded.family,
                num_layers=adapter.num_layers(config),
                num_heads=adapter.num_heads(config),
                kept_heads=tuple(current_kept_heads(model)),
                neurons_per_layer=tuple(neurons_per_layer(model)) if neuron_record(config) is not None else (),
                num_neurons=adapter.num_neurons(config),
                dataset=dataset,
                eval_split=eval_split,
                label_names=_label_names(config),
                pruned_accuracy=accuracy[_TORCH].accuracy if accuracy else None,
                int8_accuracy=accuracy[fmt].accuracy if accuracy and int8 is not None else None,
                pruned_parameters=count_parameters(model).total,
                speed=_speed_figures(speed),
                speed_baseline="the PyTorch model",
                onnx_max_abs_diff=onnx_export.parity.max_abs_diff,
                # Each card quotes its own graph's parity: the int8 graph's deviation for onnx-int8.
                variant=fmt,
                parity_max_abs_diff=own.max_abs_diff if own is not None else None,
                parity_agreement=own.prediction_agreement if own is not None else None,
                pruned_macro_f1=accuracy[_TORCH].macro_f1 if accuracy else None,
                int8_macro_f1=accuracy[fmt].macro_f1 if accuracy and int8 is not None else None,
            ),
            [stage],
            model_dir=str(checkpoint),
            onnx_dir=out.name,
        )
    say(f"done: {fmt} export in {out}")
    return CheckpointExport(
        format=fmt,
        checkpoint=str(source),
        output=str(out),
        family=loaded.family,
        heads_per_layer=tuple(heads_per_layer(model)),
        parameters=count_parameters(model).total,
        parity=onnx_export.parity,
        onnx=dataclasses.replace(onnx_export, path=str(out) if fmt == "onnx" else ""),
        int8=dataclasses.replace(int8, path=str(out)) if int8 is not None else None,
        dataset=dataset,
        eval_split=eval_split,
        accuracy=accuracy,
        speed=speed,
        wall_s=time.perf_counter() - started,
    )


def _evaluation_rows(
    model: Any, tokenizer: Any, dataset: str | None, options: DatasetOptions, max_length: int
) -> tuple[EncodedDataset | None, str | None]:
    if dataset is None:
        return None, None
    splits = load_splits(dataset, options)
    classes = len(splits.label_names)
    if classes != int(model.config.num_labels):
        raise DatasetError(
            f"the dataset has {classes} classes but the model predicts {model.config.num_labels}; "
            "give the dataset the model was pruned on"
        )
    return encode(tokenizer, splits.eval, max_length=max_length), splits.eval_split


def _accuracies(
    model: Any, graph_dir: Path, rows: EncodedDataset | None, fmt: str, int8: Int8Export | None
) -> dict[str, ClassificationMetrics] | None:
    if rows is None:
        return None
    exported = int8.accuracy if int8 is not None and int8.accuracy is not None else evaluate_onnx(graph_dir, rows)
    return {_TORCH: evaluate(model, rows), fmt: exported}


def _speed_length(rows: EncodedDataset | None) -> int:
    """The run's rule: the evaluation split's 95th-percentile length, within [8, 64]; 64 without data."""
    if rows is None:
        return 64
    return int(min(64, max(8, np.percentile(rows.lengths, 95))))


def _label_names(config: Any) -> tuple[str, ...]:
    id2label = getattr(config, "id2label", None) or {}
    return tuple(str(id2label[i]) for i in sorted(id2label))


def _speed_figures(speed: RuntimeSpeed | None) -> tuple[SpeedFigure, ...]:
    if speed is None:
        return ()
    runtime = {_TORCH: "PyTorch fp32", "onnx": "onnxruntime fp32", "onnx-int8": "onnxruntime int8"}
    return tuple(
        SpeedFigure(runtime=runtime.get(name, name), model="this model", batch_size=row.batch_size,
                    seq_len=speed.seq_len, p50_ms=latency.p50_ms, speedup=row.speedup[name],
                    speedup_low=row.speedup_low.get(name), speedup_high=row.speedup_high.get(name),
                    p25_ms=latency.p25_ms, p75_ms=latency.p75_ms)
        for row in speed.results
        for name, latency in row.latency.items()
    )

