"""Deployable copies of a pruned classifier: ONNX checked against PyTorch, int8, runtimes, model cards.

Reading order: ``_records`` (what an export reports) -> ``_runtime`` (onnxruntime sessions) -> ``_onnx``
(``export_onnx`` and parity) -> ``_int8`` (``quantize_int8``) -> ``_card_facts``, ``_card_body`` and
``_model_card`` (the model cards) -> ``_from_checkpoint`` (``cahp export`` of a saved checkpoint)."""

from ._calibration import CALIBRATION_ROWS
from ._card_facts import ModelCardInputs, SpeedFigure, is_hub_id
from ._from_checkpoint import CheckpointExport, export_checkpoint
from ._int8 import quantize_int8
from ._model_card import build_model_card, write_model_card
from ._onnx import OPSET, check_parity, export_onnx, generated_rows, onnx_input_names
from ._records import ExportRecord, RuntimeSpeed, describe_speedup
from ._runtime import compare_runtimes, evaluate_onnx, onnx_session, run_logits, run_logits_rowwise

__all__ = [
    "CALIBRATION_ROWS", "OPSET", "build_model_card",
    "check_parity", "CheckpointExport", "compare_runtimes", "describe_speedup",
    "evaluate_onnx", "export_checkpoint", "export_onnx", "ExportRecord", "generated_rows", "is_hub_id",
    "ModelCardInputs", "onnx_input_names", "onnx_session", "quantize_int8", "run_logits", "run_logits_rowwise",
    "RuntimeSpeed",
    "SpeedFigure", "write_model_card",
]
