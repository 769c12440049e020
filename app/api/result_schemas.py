"""What a job made, as the API answers it: ``JobResult`` (its headline figures) and ``JobTarget`` (a target's record).

Both are built from the engine's records, field for field (``RunSummary``, ``TargetRecord``), every field
nullable (rows from older releases may lack some), so a figure the engine adds is in the API's answer too.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Any, get_type_hints

from pydantic import BaseModel, Field, create_model

from cahp_engine.run import RunSummary, TargetRecord

#: What each figure of the engine's ``RunSummary`` means, in the OpenAPI schema.
_RESULT_DESCRIPTIONS: dict[str, str] = {
    "k_star": "Number of clusters used: the knee, or `heads_to_keep`",
    "heads_total": "Attention heads of the dense model, L * H",
    "heads_kept": "Heads left after pruning",
    "retention": "`heads_kept / heads_total`",
    "dense_accuracy": "Accuracy of the dense model on the evaluation split (after dense fine-tuning, if it ran)",
    "pruned_accuracy": "Accuracy of the pruned model after recovery",
    "speedup": "Dense p50 latency over pruned p50 latency at batch size 32 (else the first batch size timed)",
    "onnx_max_abs_diff": "The ONNX export's largest absolute logit difference from PyTorch; null without an export",
    "onnx_speedup": "Dense PyTorch p50 over pruned onnxruntime p50 (CPU, batch 32)",
    "int8_accuracy": "Accuracy of `onnx-int8/` on the evaluation split; null without `quantize=int8`",
    "int8_speedup": "Dense PyTorch p50 over `onnx-int8/` p50 (CPU, batch 32); null without `quantize=int8`",
    "base_model": "The dense model by name: its hub id, its checkpoint's `_name_or_path`, else the uploaded "
    "directory's or archive's name",
    "dataset": "The dataset by name",
    "dense_macro_f1": "Macro-F1 of the dense model (evaluation split)",
    "pruned_macro_f1": "Macro-F1 of the pruned model after recovery",
    "onnx_accuracy": "Accuracy of `onnx/` in onnxruntime",
    "onnx_macro_f1": "Macro-F1 of `onnx/` in onnxruntime",
    "int8_macro_f1": "Macro-F1 of `onnx-int8/`",
    "int8_max_abs_diff": "The int8 graph's largest absolute logit difference from the pruned PyTorch model "
    "(measured; int8 is not exact)",
    "speedup_low": "95 % interval of `speedup` (low end); an interval holding 1 is no measurable change",
    "speedup_high": "95 % interval of `speedup` (high end)",
    "onnx_speedup_low": "95 % interval of `onnx_speedup` (low end)",
    "onnx_speedup_high": "95 % interval of `onnx_speedup` (high end)",
    "int8_speedup_low": "95 % interval of `int8_speedup` (low end)",
    "int8_speedup_high": "95 % interval of `int8_speedup` (high end)",
    "warnings": "Every warning of the run; quality warnings (a class never predicted, macro-F1 near chance, too "
    "large a drop) first",
    "warning_codes": "A stable code for each of `warnings`, in the same order: class_lost, near_chance, "
    "accuracy_drop, macro_f1_drop, int8_accuracy_drop, recall_drop, untrained_head, no_knee, no_stability, "
    "budget_noise, validation_seen, target_missed or other",
}


def _job_result_model() -> type[BaseModel]:
    """``JobResult``: the engine's :class:`RunSummary` field for field, every field nullable (rows from older
    releases may lack some), so a figure the engine adds is in the API's answer too."""
    hints = get_type_hints(RunSummary)
    fields: dict[str, Any] = {
        f.name: (hints[f.name] | None, Field(default=None, description=_RESULT_DESCRIPTIONS.get(f.name)))
        for f in dataclasses.fields(RunSummary)
    }
    return create_model("JobResult", __doc__="The headline figures of a succeeded job (report.json's `summary`).",
                        **fields)


if TYPE_CHECKING:

    class JobResult(BaseModel):
        """The engine's ``RunSummary``, every field nullable."""

else:
    JobResult = _job_result_model()


#: A numpydoc ``Attributes`` entry: ``name : type`` (or ``a, b : type``), then its indented description.
_ATTRIBUTE = re.compile(r"^    (\w+(?:, \w+)*) : [^\n]*\n((?:        [^\n]*\n?)*)", re.MULTILINE)


def _attribute_descriptions(record: type) -> dict[str, str]:
    """Each field's description, from the ``Attributes`` section of ``record``'s numpydoc docstring."""
    found: dict[str, str] = {}
    for names, text in _ATTRIBUTE.findall(record.__doc__ or ""):
        for name in names.split(", "):
            found[name] = " ".join(text.split()).replace("``", "`")
    return found


def _job_target_model() -> type[BaseModel]:
    """``JobTarget``: the engine's :class:`TargetRecord` field for field, described by its docstring."""
    hints, words = get_type_hints(TargetRecord), _attribute_descriptions(TargetRecord)
    fields: dict[str, Any] = {
        f.name: (hints[f.name] | None, Field(default=None, description=words.get(f.name)))
        for f in dataclasses.fields(TargetRecord)
    }
    return create_model("JobTarget", __doc__="What a run pruned to a speed or FLOPs target decided (report.json's "
                        "`target`): the allocation, its predicted and measured speed-up, what each layer keeps.",
                        **fields)


if TYPE_CHECKING:

    class JobTarget(BaseModel):
        """The engine's ``TargetRecord``, every field nullable."""

else:
    JobTarget = _job_target_model()
