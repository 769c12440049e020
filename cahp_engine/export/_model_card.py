"""The model card (``README.md``) of a pruned classifier, for the hub and model browsers.

:func:`build_model_card` turns plain typed facts (:class:`ModelCardInputs`) into a
:class:`huggingface_hub.ModelCard`: YAML metadata (base model, dataset, metrics, tags, and a ``cahp``
block with the heads kept) and a body with the heads kept per layer, k* and the polynomial degree,
accuracy before and after pruning, parameters, measured speed-ups, and how to load the model with
cahp and with onnxruntime. Unknown facts are left out rather than printed as blanks.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from cahp_engine.errors import InvalidInputError

README = "README.md"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
_EXAMPLE_TEXT = "a gripping, beautifully acted film"


@dataclass(frozen=True)
class SpeedFigure:
    """One latency measurement shown on the card.

    ``speedup`` is the baseline's p50 over this one's, at the same batch size and length (the baseline
    is :attr:`ModelCardInputs.speed_baseline`, the dense PyTorch model in a pruning run).
    """

    runtime: str
    model: str
    batch_size: int
    seq_len: int
    p50_ms: float
    speedup: float | None = None


@dataclass(frozen=True)
class ModelCardInputs:
    """What the card says about a pruned classifier; None (or empty) leaves a fact out.

    Attributes
    ----------
    family : model family, e.g. ``"bert"``
    num_layers, num_heads : int
        Layers and heads per layer of the unpruned architecture.
    kept_heads : tuple of num_layers tuples of int
        Original indices of the heads each layer keeps.
    base_model : the model that was pruned (a hub id goes into the metadata; a path only into the text)
    dataset, eval_split : the dataset the accuracies were measured on, and its split
    label_names : class names, index i for class i
    strategy, k_star, poly_degree : how the heads were chosen (CAHP's k* and Kneedle degree)
    dense_accuracy, accuracy_before_recovery, pruned_accuracy, int8_accuracy : float in [0, 1]
    dense_parameters, pruned_parameters : int
    speed : latency figures, see :class:`SpeedFigure`
    speed_baseline : what the speed-ups are relative to (the dense PyTorch model in a pruning run)
    onnx_max_abs_diff : the ONNX export's parity figure
    license, model_name : optional metadata
    """

    family: str
    num_layers: int
    num_heads: int
    kept_heads: tuple[tuple[int, ...], ...]
    base_model: str | None = None
    dataset: str | None = None
    eval_split: str | None = None
    label_names: tuple[str, ...] = ()
    strategy: str | None = None
    k_star: int | None = None
    poly_degree: int | None = None
    dense_accuracy: float | None = None
    accuracy_before_recovery: float | None = None
    pruned_accuracy: float | None = None
    int8_accuracy: float | None = None
    dense_parameters: int | None = None
    pruned_parameters: int | None = None
    speed: tuple[SpeedFigure, ...] = ()
    speed_baseline: str = "the dense PyTorch model"
    onnx_max_abs_diff: float | None = None
    license: str | None = None
    model_name: str | None = None

    def __post_init__(self) -> None:
        if len(self.kept_heads) != self.num_layers:
            raise InvalidInputError(
                f"`kept_heads` must list all {self.num_layers} layers, got {len(self.kept_heads)}"
            )
        for layer, heads in enumerate(self.kept_heads):
            if any(not 0 <= h < self.num_heads for h in heads):
                raise InvalidInputError(
                    f"`kept_heads[{layer}]` must hold head indices in [0, {self.num_heads}), got {list(heads)}"
                )

    @property
    def heads_total(self) -> int:
        return self.num_layers * self.num_heads

    @property
    def heads_kept(self) -> int:
        return sum(len(h) for h in self.kept_heads)


def build_model_card(inputs: ModelCardInputs, *, model_dir: str = "model", onnx_dir: str = "onnx") -> ModelCard:
    """The card of a pruned classifier.

    Parameters
    ----------
    inputs : ModelCardInputs
    model_dir, onnx_dir : str
        Paths the loading examples use for the PyTorch checkpoint and the ONNX export.
    """
    return ModelCard(f"---\n{_metadata(inputs).to_yaml()}\n---\n{_body(inputs, model_dir, onnx_dir)}")


def write_model_card(
    inputs: ModelCardInputs, directories: Sequence[str | Path], *, model_dir: str = "model", onnx_dir: str = "onnx"
) -> ModelCard:
    """Write the card as ``README.md`` into each of ``directories`` (which must exist) and return it."""
    card = build_model_card(inputs, model_dir=model_dir, onnx_dir=onnx_dir)
    for directory in directories:
        card.save(Path(directory) / README)
    return card


def _is_hub_id(ref: str | None) -> bool:
    return ref is not None and bool(_HUB_ID.match(ref)) and ".." not in ref


def _title(inputs: ModelCardInputs) -> str:
    if inputs.model_name:
        return inputs.model_name
    base = Path(inputs.base_model).name if inputs.base_model else f"{inputs.family} classifier"
    if _is_hub_id(inputs.base_model):
        base = str(inputs.base_model).split("/")[-1]
    return f"{base} (CAHP-pruned, {inputs.heads_kept}/{inputs.heads_total} heads)"


def _metadata(inputs: ModelCardInputs) -> ModelCardData:
    dataset_id = inputs.dataset if _is_hub_id(inputs.dataset) else None
    eval_results = None
    if inputs.pruned_accuracy is not None and inputs.dataset:
        name = dataset_id or Path(inputs.dataset).name
        eval_results = [
            EvalResult(
                task_type="text-classification",
                dataset_type=name,
                dataset_name=name,
                dataset_split=inputs.eval_split,
                metric_type="accuracy",
                metric_value=round(float(inputs.pruned_accuracy), 4),
            )
        ]
    cahp = {
        "strategy": inputs.strategy,
        "k_star": inputs.k_star,
        "poly_degree": inputs.poly_degree,
        "heads_total": inputs.heads_total,
        "heads_kept": inputs.heads_kept,
        "kept_heads": {str(layer): list(heads) for layer, heads in enumerate(inputs.kept_heads)},
    }
    return ModelCardData(
        base_model=inputs.base_model if _is_hub_id(inputs.base_model) else None,
        datasets=[dataset_id] if dataset_id else None,
        library_name="transformers",
        pipeline_tag="text-classification",
        license=inputs.license,
        metrics=["accuracy"] if inputs.pruned_accuracy is not None else None,
        tags=["cahp", "attention-head-pruning", "pruned", inputs.family, "onnx", "text-classification"],
        model_name=_title(inputs) if eval_results else None,
        eval_results=eval_results,
        cahp={k: v for k, v in cahp.items() if v is not None},
    )


def _pct(value: float) -> str:
    return f"{100 * value:.2f}%"


def _body(inputs: ModelCardInputs, model_dir: str, onnx_dir: str) -> str:
    lines = [f"# {_title(inputs)}", ""]
    base = f"`{inputs.base_model}`" if inputs.base_model else f"a {inputs.family} sequence classifier"
    lines += [
        f"{base} with its attention heads pruned by CAHP (Complementary Attention Head Pruning): it keeps "
        f"**{inputs.heads_kept} of {inputs.heads_total} heads** ({_pct(inputs.heads_kept / inputs.heads_total)}); "
        "the other heads are removed from the weights, not masked.",
        "",
        "## Pruning",
        "",
    ]
    if inputs.strategy:
        lines.append(f"- strategy: `{inputs.strategy}`")
    if inputs.k_star is not None:
        degree = f" (Kneedle polynomial degree {inputs.poly_degree})" if inputs.poly_degree is not None else ""
        lines.append(f"- k* = {inputs.k_star} clusters of heads{degree}")
    if inputs.label_names:
        lines.append("- classes: " + ", ".join(f"{i} = `{n}`" for i, n in enumerate(inputs.label_names)))
    lines += ["", "| layer | heads kept | original indices |", "|---:|---:|---|"]
    for layer, heads in enumerate(inputs.kept_heads):
        shown = ", ".join(str(h) for h in heads) if heads else "none (attention skipped)"
        lines.append(f"| {layer} | {len(heads)} / {inputs.num_heads} | {shown} |")
    lines.append("")

    accuracies = [("dense", inputs.dense_accuracy), ("pruned, before recovery fine-tuning",
                  inputs.accuracy_before_recovery), ("pruned", inputs.pruned_accuracy),
                  ("pruned, ONNX int8", inputs.int8_accuracy)]
    shown_acc = [(label, value) for label, value in accuracies if value is not None]
    if shown_acc or inputs.dense_parameters is not None:
        lines += ["## Results", ""]
    if shown_acc:
        where = f" on `{inputs.dataset}`" if inputs.dataset else ""
        where += f" ({inputs.eval_split} split)" if inputs.eval_split else ""
        lines += [f"Accuracy{where}:", "", "| model | accuracy |", "|---|---:|"]
        lines += [f"| {label} | {_pct(value)} |" for label, value in shown_acc]
        lines.append("")
    if inputs.dense_parameters is not None and inputs.pruned_parameters is not None:
        saved = 1 - inputs.pruned_parameters / inputs.dense_parameters
        lines += [f"Parameters: {inputs.dense_parameters:,} dense, {inputs.pruned_parameters:,} pruned "
                  f"({_pct(saved)} fewer).", ""]
    elif inputs.pruned_parameters is not None:
        lines += [f"Parameters: {inputs.pruned_parameters:,}.", ""]
    if inputs.speed:
        lines += ["## Speed", "", "CPU latency, median of timed forward passes on random token ids:", "",
                  f"| runtime | model | batch | tokens | p50 ms | speed-up vs {inputs.speed_baseline} |",
                  "|---|---|---:|---:|---:|---:|"]
        for s in inputs.speed:
            speedup = f"x{s.speedup:.2f}" if s.speedup is not None else ""
            lines.append(f"| {s.runtime} | {s.model} | {s.batch_size} | {s.seq_len} | {s.p50_ms:.2f} | {speedup} |")
        lines.append("")
    if inputs.onnx_max_abs_diff is not None:
        lines += [f"The ONNX export reproduces the PyTorch logits to {inputs.onnx_max_abs_diff:.1e} "
                  "(largest absolute difference, inputs padded on both sides).", ""]
    lines += [
        "## How to use",
        "",
        f"With cahp installed, from the PyTorch checkpoint in `{model_dir}/`:",
        "",
        "```python",
        "from cahp_engine import load_pruned",
        "from transformers import AutoTokenizer",
        f'model, tokenizer = load_pruned("{model_dir}"), AutoTokenizer.from_pretrained("{model_dir}")',
        f'logits = model(**tokenizer(["{_EXAMPLE_TEXT}"], return_tensors="pt")).logits',
        "print(model.config.id2label[int(logits.argmax())])",
        "```",
        "",
        "A plain `AutoModelForSequenceClassification.from_pretrained` cannot load the checkpoint: its "
        "layers have fewer heads than `config.json` describes (the `cahp` record says which).",
        "",
        f"With onnxruntime only (no cahp, no torch), from the ONNX export in `{onnx_dir}/`:",
        "",
        "```python",
        "import onnxruntime as ort",
        "from transformers import AutoTokenizer",
        f'tokenizer, session = AutoTokenizer.from_pretrained("{onnx_dir}"), '
        f'ort.InferenceSession("{onnx_dir}/model.onnx")',
        f'encoded = tokenizer(["{_EXAMPLE_TEXT}"], return_tensors="np")',
        'logits = session.run(["logits"], {i.name: encoded[i.name] for i in session.get_inputs()})[0]',
        "```",
        "",
        "The graph takes `input_ids`, `attention_mask` (and `token_type_ids` when the model uses token "
        "types), int64 of shape (batch_size, sequence_length), and returns `logits` (batch_size, num_labels).",
        "",
    ]
    return "\n".join(lines)
