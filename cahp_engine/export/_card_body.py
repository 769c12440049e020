"""The text of a pruned classifier's model card: what it is, how it was made, how good, how fast, how to load.

A quality warning comes first, right under the title, so a person deploying the model cannot miss
it. Speed-ups whose 95 % interval holds 1 read "no measurable change". The parity quoted is the one
of the directory the card describes: the ONNX graph's for ``onnx/``, the int8 graph's (measured, with
no threshold) for ``onnx-int8/``, the reloaded checkpoint's for ``model/``.

Names come from whoever submitted the job (its name, labels, class names, the inputs' names) and are
written so that they stay text: on one line, with ``<``, ``>`` and ``&`` as character references and
Markdown's own marks escaped (:func:`_text`), or in a code span only when they hold nothing a code span
could not contain (:func:`_code`). No name can open a heading, an HTML comment that hides the quality
warnings, a link or a tag.
"""

from __future__ import annotations

import html
import re
from urllib.parse import quote

from cahp_engine.export._card_facts import ModelCardInputs, SpeedFigure
from cahp_engine.export._records import describe_speedup

_EXAMPLE_TEXT = "a gripping, beautifully acted film"
_VARIANT_TEXT = {
    "pytorch": "This directory holds the pruned PyTorch checkpoint (safetensors).",
    "onnx": "This directory holds the pruned model as an ONNX graph (fp32), for onnxruntime.",
    "onnx-int8": "This directory holds the pruned model as an ONNX graph with dynamically quantized int8 "
                 "weights, for onnxruntime.",
}


def card_body(inputs: ModelCardInputs, model_dir: str, onnx_dir: str) -> str:
    """The card's Markdown body (everything after the YAML metadata)."""
    lines = [f"# {_text(inputs.title)}", ""]
    if inputs.warnings:
        lines += ["> **Quality warnings** - read these before deploying this model:", ">"]
        lines += [f"> - {_line(warning)}" for warning in inputs.warnings]
        lines.append("")
    base = _code(inputs.base_model) if inputs.base_model else f"a {inputs.family} sequence classifier"
    lines += [
        f"{base} with its attention heads pruned by CAHP (Complementary Attention Head Pruning): it keeps "
        f"**{inputs.heads_kept} of {inputs.heads_total} heads** ({_pct(inputs.heads_kept / inputs.heads_total)}); "
        "the other heads are removed from the weights, not masked. " + _VARIANT_TEXT[inputs.variant],
        "",
    ]
    lines += _identity(inputs)
    if inputs.recipe:
        lines += ["## How it was made", ""] + [f"- {_line(line)}" for line in inputs.recipe] + [""]
    lines += _pruning(inputs)
    lines += _results(inputs)
    lines += _speed(inputs)
    lines += _parity(inputs)
    lines += _usage(model_dir, onnx_dir)
    return "\n".join(lines)


#: Markdown's inline marks, escaped with a backslash in a name written as text.
_MARKS = re.compile(r"([\\`*_\[\]#|~])")
#: What a code span cannot hold safely: its own delimiter, a table's cell border, markup, a line break.
_NOT_IN_CODE = re.compile(r"[`|<>&\r\n\x00-\x1f\x7f\u2028\u2029]")


def _line(value: object) -> str:
    """``value`` on one line with ``<``, ``>`` and ``&`` as references: no tag, comment or block can start."""
    return html.escape(" ".join(str(value).split()), quote=False)


def _text(value: object) -> str:
    """A name as Markdown text that reads as itself: one line, no markup, no HTML."""
    return _MARKS.sub(r"\\\1", _line(value))


def _code(value: object) -> str:
    """A name in a code span, or as escaped text when it holds what a code span cannot."""
    text = str(value)
    return f"`{text}`" if text.strip() and not _NOT_IN_CODE.search(text) else _text(text)


def _pct(value: float) -> str:
    return f"{100 * value:.2f}%"


def _identity(inputs: ModelCardInputs) -> list[str]:
    facts: list[str] = []
    if inputs.base_model:
        hub = inputs.base_hub_id
        link = f" ([hub](https://huggingface.co/{quote(hub, safe='/')}))" if hub else ""
        facts.append(f"- base model: {_code(inputs.base_model)}{link}")
    if inputs.dataset:
        split = f", evaluated on its {_code(inputs.eval_split)} split" if inputs.eval_split else ""
        facts.append(f"- dataset: {_code(inputs.dataset)}{split}")
    if inputs.label_names:
        facts.append("- classes: " + ", ".join(f"{i} = {_code(n)}" for i, n in enumerate(inputs.label_names)))
    if inputs.job_id:
        facts.append(f"- job: {_code(inputs.job_id)}")
    if inputs.labels:
        facts.append("- labels: " + ", ".join(_code(f"{k}={v}") for k, v in sorted(inputs.labels.items())))
    if inputs.cahp_version:
        facts.append(f"- made by cahp {inputs.cahp_version}")
    return ["## What this model is", "", *facts, ""] if facts else []


def _pruning(inputs: ModelCardInputs) -> list[str]:
    lines = ["## Pruning", ""]
    if inputs.strategy:
        lines.append(f"- strategy: `{inputs.strategy}`")
    if inputs.k_star is not None:
        degree = f" (Kneedle polynomial degree {inputs.poly_degree})" if inputs.poly_degree is not None else ""
        lines.append(f"- k* = {inputs.k_star} clusters of heads{degree}")
    if inputs.neurons_per_layer:
        lines += ["", "| layer | heads kept | original indices | feed-forward neurons kept |", "|---:|---:|---|---:|"]
    else:
        lines += ["", "| layer | heads kept | original indices |", "|---:|---:|---|"]
    for layer, heads in enumerate(inputs.kept_heads):
        shown = ", ".join(str(h) for h in heads) if heads else "none (attention skipped)"
        row = f"| {layer} | {len(heads)} / {inputs.num_heads} | {shown} |"
        if inputs.neurons_per_layer:
            kept = inputs.neurons_per_layer[layer]
            row += f" {kept} / {inputs.num_neurons}{' (feed-forward skipped)' if kept == 0 else ''} |"
        lines.append(row)
    return [*lines, ""]


def _results(inputs: ModelCardInputs) -> list[str]:
    rows = [("dense", inputs.dense_accuracy, inputs.dense_macro_f1),
            ("pruned, before recovery fine-tuning", inputs.accuracy_before_recovery, None),
            ("pruned", inputs.pruned_accuracy, inputs.pruned_macro_f1),
            ("pruned, ONNX fp32", inputs.onnx_accuracy, inputs.onnx_macro_f1),
            ("pruned, ONNX int8", inputs.int8_accuracy, inputs.int8_macro_f1)]
    shown = [(label, acc, f1) for label, acc, f1 in rows if acc is not None]
    if not shown and inputs.dense_parameters is None and inputs.pruned_parameters is None:
        return []
    lines = ["## Results", ""]
    if shown:
        where = f" on {_code(inputs.dataset)}" if inputs.dataset else ""
        where += f" ({_text(inputs.eval_split)} split)" if inputs.eval_split else ""
        lines += [f"Scores{where}:", "", "| model | accuracy | macro-F1 |", "|---|---:|---:|"]
        lines += [f"| {label} | {_pct(acc)} | {_pct(f1) if f1 is not None else ''} |" for label, acc, f1 in shown]
        lines.append("")
    if inputs.recall and inputs.label_names:
        models = list(inputs.recall)
        lines += ["Recall per class (the share of each class's rows predicted as that class):", "",
                  "| class | " + " | ".join(models) + " |", "|---|" + "---:|" * len(models)]
        for i, name in enumerate(inputs.label_names):
            cells = [inputs.recall[m][i] if i < len(inputs.recall[m]) else None for m in models]
            lines.append(f"| {i} {_code(name)} | " + " | ".join(_pct(c) if c is not None else "" for c in cells) + " |")
        lines.append("")
    if inputs.dense_parameters is not None and inputs.pruned_parameters is not None:
        saved = 1 - inputs.pruned_parameters / inputs.dense_parameters
        lines += [f"Parameters: {inputs.dense_parameters:,} dense, {inputs.pruned_parameters:,} pruned "
                  f"({_pct(saved)} fewer).", ""]
    elif inputs.pruned_parameters is not None:
        lines += [f"Parameters: {inputs.pruned_parameters:,}.", ""]
    return lines


def _speed(inputs: ModelCardInputs) -> list[str]:
    if not inputs.speed:
        return []
    lines = ["## Speed", "",
             "CPU latency of forward passes on random token ids, every model timed in the same interleaved "
             "rounds: the median (p25-p75) of the timed passes, and the speed-up with its 95 % interval over "
             "those rounds; a speed-up whose interval holds x1.00 is no measurable change. "
             "The rows in bold are this directory's model.", "",
             f"| runtime | model | batch | tokens | p50 ms (p25-p75) | speed-up vs {inputs.speed_baseline} |",
             "|---|---|---:|---:|---:|---|"]
    lines += [_speed_row(s) for s in inputs.speed]
    return [*lines, ""]


def _speed_row(s: SpeedFigure) -> str:
    spread = f" ({s.p25_ms:.2f}-{s.p75_ms:.2f})" if s.p25_ms is not None and s.p75_ms is not None else ""
    speedup = describe_speedup(s.speedup, s.speedup_low, s.speedup_high) if s.speedup is not None else ""
    runtime, model = (f"**{s.runtime}**", f"**{s.model}**") if s.current else (s.runtime, s.model)
    return f"| {runtime} | {model} | {s.batch_size} | {s.seq_len} | {s.p50_ms:.2f}{spread} | {speedup} |"


def _parity(inputs: ModelCardInputs) -> list[str]:
    diff = inputs.parity_max_abs_diff
    agreement = (f"; it predicts the same class on {_pct(inputs.parity_agreement)} of them"
                 if inputs.parity_agreement is not None else "")
    if inputs.variant == "onnx-int8" and diff is not None:
        return [f"This int8 graph's logits differ from the pruned PyTorch model's by up to {diff:.2g} (largest "
                f"absolute difference, inputs padded on both sides){agreement}. int8 is not meant to be exact: "
                "its accuracy above is what counts.", ""]
    if inputs.variant == "pytorch" and diff is not None:
        text = (f"The checkpoint, reloaded, reproduces the pruned model's logits to {diff:.1e} (largest absolute "
                "difference).")
        if inputs.onnx_max_abs_diff is not None:
            text += f" Its ONNX export reproduces them to {inputs.onnx_max_abs_diff:.1e}."
        return [text, ""]
    diff = diff if diff is not None else inputs.onnx_max_abs_diff
    if diff is None:
        return []
    return [f"The ONNX export reproduces the PyTorch logits to {diff:.1e} (largest absolute difference, inputs "
            f"padded on both sides){agreement}.", ""]


def _usage(model_dir: str, onnx_dir: str) -> list[str]:
    return [
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
        "types), int64 of shape (batch_size, sequence_length), and returns `logits` (batch_size, num_labels); "
        "`config.json`'s `id2label` names the classes.",
        "",
    ]
