"""The model card (``README.md``) of a pruned classifier, for the hub, model registries and people.

:func:`build_model_card` turns plain typed facts (:class:`~cahp_engine.export.ModelCardInputs`) into a
:class:`huggingface_hub.ModelCard`: YAML metadata in the Hugging Face model card format
(``base_model``, ``datasets``, ``metrics``, ``model-index`` with this directory's accuracy and macro-F1,
tags, and a ``cahp`` block with the job, its labels, the heads kept and any quality warning) and a body
(:mod:`cahp_engine.export._card_body`) that says what the model is, how it was made, how good it is
per class, how fast, how exactly this directory's graph reproduces the pruned model, and how to load
it. Unknown facts are left out rather than printed as blanks.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from cahp_engine.export._card_body import card_body
from cahp_engine.export._card_facts import ModelCardInputs

README = "README.md"


def build_model_card(inputs: ModelCardInputs, *, model_dir: str = "model", onnx_dir: str = "onnx") -> ModelCard:
    """The card of a pruned classifier.

    Parameters
    ----------
    inputs : ModelCardInputs
    model_dir, onnx_dir : str
        Paths the loading examples use for the PyTorch checkpoint and the ONNX export.
    """
    return ModelCard(f"---\n{_metadata(inputs).to_yaml()}\n---\n{card_body(inputs, model_dir, onnx_dir)}")


def write_model_card(
    inputs: ModelCardInputs, directories: Sequence[str | Path], *, model_dir: str = "model", onnx_dir: str = "onnx"
) -> ModelCard:
    """Write the card as ``README.md`` into each of ``directories`` (which must exist) and return it."""
    card = build_model_card(inputs, model_dir=model_dir, onnx_dir=onnx_dir)
    for directory in directories:
        card.save(Path(directory) / README)
    return card


def _metadata(inputs: ModelCardInputs) -> ModelCardData:
    dataset_id = inputs.dataset_hub_id_or_none
    eval_results = None
    accuracy, macro_f1 = inputs.accuracy, inputs.macro_f1
    if accuracy is not None and inputs.dataset:
        name = dataset_id or Path(inputs.dataset).name

        def result(metric: str, value: float, **extra: Any) -> EvalResult:
            return EvalResult(task_type="text-classification", dataset_type=name, dataset_name=name,
                              dataset_split=inputs.eval_split, metric_type=metric,
                              metric_value=round(float(value), 4), **extra)

        eval_results = [result("accuracy", accuracy)]
        if macro_f1 is not None:
            eval_results.append(result("f1", macro_f1, metric_name="macro-F1", metric_args={"average": "macro"}))
    cahp = {
        "variant": inputs.variant,
        "base_model": inputs.base_model,
        "job_id": inputs.job_id,
        "labels": dict(inputs.labels) or None,
        "version": inputs.cahp_version,
        "strategy": inputs.strategy,
        "k_star": inputs.k_star,
        "poly_degree": inputs.poly_degree,
        "heads_total": inputs.heads_total,
        "heads_kept": inputs.heads_kept,
        "kept_heads": {str(layer): list(heads) for layer, heads in enumerate(inputs.kept_heads)},
        "neurons_per_layer": list(inputs.neurons_per_layer) or None,
        "warnings": list(inputs.warnings) or None,
    }
    metrics = None
    if accuracy is not None:
        metrics = ["accuracy", "f1"] if macro_f1 is not None else ["accuracy"]
    tags = ["cahp", "attention-head-pruning", "pruned", inputs.family, "text-classification"]
    if inputs.variant != "pytorch":
        tags.append("onnx")
    if inputs.variant == "onnx-int8":
        tags.append("int8")
    return ModelCardData(
        base_model=inputs.base_hub_id,
        datasets=[dataset_id] if dataset_id else None,
        library_name="transformers" if inputs.variant == "pytorch" else "onnx",
        pipeline_tag="text-classification",
        license=inputs.license,
        metrics=metrics,
        tags=tags,
        model_name=inputs.title if eval_results else None,
        eval_results=eval_results,
        cahp={k: v for k, v in cahp.items() if v is not None},
    )
