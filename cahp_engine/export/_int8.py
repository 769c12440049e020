"""Dynamic int8 quantization of an exported ONNX directory, with its deviation from PyTorch and its accuracy.

onnxruntime's ``quantize_dynamic`` rewrites every MatMul/Gemm with a constant weight to int8 weights
and uint8 activations quantized at run time. The copy is measured, not held to a threshold: int8 is
not meant to reproduce the float logits exactly.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import onnx
from onnxruntime.quantization import QuantType, quantize_dynamic
from torch import nn

from cahp_engine.data import EncodedDataset
from cahp_engine.errors import PipelineError
from cahp_engine.export._calibration import quantize_static_qdq
from cahp_engine.export._onnx import MODEL_FILES, PARITY_SAMPLES, check_parity
from cahp_engine.export._records import Int8Export
from cahp_engine.export._runtime import ONNX_FILE, evaluate_onnx, file_size, resolve_onnx_file, runtime_versions


def quantize_int8(
    onnx_dir: str | Path,
    out_dir: str | Path,
    *,
    model: nn.Module | None = None,
    parity_data: EncodedDataset | None = None,
    eval_data: EncodedDataset | None = None,
    per_channel: bool = False,
    samples: int = PARITY_SAMPLES,
    seed: int = 0,
    calibration_data: EncodedDataset | None = None,
) -> Int8Export:
    """Dynamic int8 quantization of an exported directory into ``out_dir`` (same layout).

    Parameters
    ----------
    onnx_dir : a directory written by :func:`export_onnx`
    out_dir : directory, created if needed; receives ``model.onnx`` (quantized) and copies of the
        config, tokenizer and card files
    model : the PyTorch model, optional
        When given, the quantized logits are compared with its logits (``deviation``, no threshold).
    parity_data : rows for that comparison (random token ids when None)
    eval_data : EncodedDataset, optional
        Scored with :func:`cahp_engine.export.evaluate_onnx` (``accuracy``).
    per_channel : bool
        One weight scale per output channel instead of per tensor.
    samples, seed : as in :func:`check_parity`
    calibration_data : EncodedDataset, optional
        When given, the activations are quantized statically (QDQ), with scales calibrated on these
        rows (:mod:`cahp_engine.export._calibration`): a row's answer no longer depends on the rows
        batched with it. Without, dynamic quantization as below.

    Notes
    -----
    onnxruntime's ``quantize_dynamic`` rewrites every MatMul/Gemm with a constant weight into an
    integer product; the attention products of two activations stay float (``MatMulConstBOnly``).
    At session creation onnxruntime fuses each into ``DynamicQuantizeMatMul``. Embeddings stay float.
    """
    started = time.perf_counter()
    source = resolve_onnx_file(onnx_dir)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for stale in MODEL_FILES:
        (out / stale).unlink(missing_ok=True)
    for item in source.parent.iterdir():
        if item.is_file() and item.name not in MODEL_FILES:
            shutil.copy2(item, out / item.name)
    target = out / ONNX_FILE
    with _quiet_quantizer():
        try:
            if calibration_data is not None:
                quantize_static_qdq(source, target, calibration_data, per_channel=per_channel,
                                    external=file_size(source) >= 2**31)
            else:
                quantize_dynamic(
                    source,
                    target,
                    weight_type=QuantType.QInt8,
                    per_channel=per_channel,
                    reduce_range=False,
                    extra_options={"MatMulConstBOnly": True},
                    # Beyond protobuf's 2 GiB the weights go to model.onnx.data, as in the fp32 export.
                    use_external_data_format=file_size(source) >= 2**31,
                )
        except Exception as exc:  # the quantizer raises plain exceptions of many types
            raise PipelineError(f"onnxruntime's quantizer failed on {str(source)!r}: {exc}") from exc
    quantize_s = time.perf_counter() - started
    graph = onnx.load(str(target), load_external_data=False)
    quantized = sum(n.op_type in ("MatMulInteger", "DynamicQuantizeMatMul", "ConvInteger") for n in graph.graph.node)
    if calibration_data is not None:  # QDQ: each quantized product's weight has its own DequantizeLinear
        quantized = sum(n.op_type == "DequantizeLinear" and n.input[0].endswith("_quantized")
                        for n in graph.graph.node)
    deviation = None
    if model is not None:
        deviation = check_parity(model, target, data=parity_data, samples=samples, threshold=None, seed=seed)
    # Dynamic int8 is scored a row at a time (each row's scales its own): the answer a row gets alone and
    # in any batch, which is how to serve it (docs/performance.md, "Does an int8 answer depend on its batch?").
    accuracy = (evaluate_onnx(target, eval_data, rowwise=calibration_data is None)
                if eval_data is not None else None)
    return Int8Export(
        path=str(out),
        model_file=ONNX_FILE,
        files=tuple(sorted(p.name for p in out.iterdir() if p.is_file())),
        per_channel=per_channel,
        quantized_nodes=int(quantized),
        size_bytes=file_size(target),
        fp32_size_bytes=file_size(source),
        quantize_s=quantize_s,
        versions=runtime_versions(),
        deviation=deviation,
        accuracy=accuracy,
    )


@contextlib.contextmanager
def _quiet_quantizer() -> Iterator[None]:
    """The quantizer logs a pre-processing hint on the root logger for every model; drop it."""
    root = logging.getLogger()

    def no_hint(record: logging.LogRecord) -> bool:
        return "pre-processing before quantization" not in record.getMessage()

    root.addFilter(no_hint)
    try:
        with warnings.catch_warnings(action="ignore"):
            yield
    finally:
        root.removeFilter(no_hint)
