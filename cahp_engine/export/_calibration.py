"""Static int8: activation scales calibrated once on the job's own rows, so a row's answer does not depend on its batch.

Dynamic quantization (``quantize_dynamic``) quantizes each MatMul's input with a scale taken from the
whole input tensor at run time: the largest activation of any row in the batch, padding included. A
row's int8 logits, and sometimes its class, then change with the rows it is batched with. Static
quantization (``quantize_static``, QDQ format) fixes every activation scale beforehand, from the
ranges a calibration pass over sample rows saw, so each row is computed the same whatever its batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_static

from cahp_engine.data import EncodedDataset, collate

#: Rows the calibration pass reads (the first ones, in batches of :data:`CALIBRATION_BATCH`).
CALIBRATION_ROWS = 256
CALIBRATION_BATCH = 16


class RowsReader(CalibrationDataReader):
    """Feeds of up to ``rows`` samples of ``data``, one padded batch at a time, for the calibration pass."""

    def __init__(self, data: EncodedDataset, names: list[str], *, rows: int = CALIBRATION_ROWS,
                 batch: int = CALIBRATION_BATCH) -> None:
        chosen = np.arange(min(rows, len(data)))
        self._batches = iter([chosen[i:i + batch] for i in range(0, len(chosen), batch)])
        self._data = data
        self._names = names
        self._width = int(data.lengths[chosen].max()) if len(chosen) else 1

    def get_next(self) -> dict[str, np.ndarray] | None:
        idx = next(self._batches, None)
        if idx is None:
            return None
        batch = collate(self._data, idx)
        # Every batch padded to one width: histogram calibrators stack the batches' activations.
        extra = self._width - batch["input_ids"].shape[1]
        feed: dict[str, Any] = {}
        for name in self._names:
            value = batch.get(name)
            array = np.zeros_like(batch["input_ids"].numpy()) if value is None else value.numpy()
            fill = self._data.pad_token_id if name == "input_ids" else 0
            feed[name] = np.pad(array, ((0, 0), (0, extra)), constant_values=fill).astype(np.int64)
        return feed


def quantize_static_qdq(source: Path, target: Path, data: EncodedDataset, *, per_channel: bool,
                        external: bool, activation_type: QuantType = QuantType.QUInt8,
                        method: CalibrationMethod = CalibrationMethod.MinMax) -> None:
    """Write ``target``: ``source`` with int8 weights and int8 activations of calibrated, fixed scales.

    Parameters
    ----------
    source, target : the fp32 ``model.onnx`` and where its int8 copy goes
    data : EncodedDataset
        Rows whose activations set the scales (min/max over up to :data:`CALIBRATION_ROWS` rows).
    per_channel : one weight scale per output channel
    external : weights in ``model.onnx.data`` (beyond protobuf's 2 GiB)
    activation_type, method : the activations' integer type (uint8: onnxruntime's fused U8S8 kernels on
        x86) and how their ranges are calibrated
    """
    names = [i.name for i in ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]).get_inputs()]
    quantize_static(
        str(source), str(target), RowsReader(data, names),
        quant_format=QuantFormat.QDQ,
        op_types_to_quantize=["MatMul", "Gemm"],
        per_channel=per_channel,
        reduce_range=False,
        activation_type=activation_type,
        weight_type=QuantType.QInt8,
        calibrate_method=method,
        use_external_data_format=external,
        # Only products with a constant weight, as in the dynamic graph: attention's own products stay float.
        extra_options={"MatMulConstBOnly": True, "ActivationSymmetric": False, "WeightSymmetric": True},
    )
