"""ONNX export of a (pruned) classifier, checked against PyTorch, and its dynamic int8 variant.

An exported directory has the layout Optimum's exporter writes
(``optimum-cli export onnx --task text-classification``): onnxruntime loads it (tested), and it is the
layout Optimum's ``ORTModel``, Triton's onnxruntime backend and KServe read (not tested against them)::

    onnx/
    ├── model.onnx            the graph with its weights (model.onnx.data beside it above 2 GiB)
    ├── config.json           the transformers config; a pruned model keeps its ``cahp`` record
    └── tokenizer.json ...    the tokenizer's files, as ``save_pretrained`` writes them

The graph takes int64 tensors of shape (batch_size, sequence_length), both axes dynamic:
``input_ids``, ``attention_mask`` and, only when the model can tell token types apart
(``type_vocab_size`` > 1, as in BERT and ELECTRA), ``token_type_ids``; it returns ``logits`` of shape
(batch_size, num_labels), float32. These are Hugging Face's names, the ones the tokenizer returns.
Opset 18. ``onnx-int8/`` has the same layout with the quantized graph as its ``model.onnx``.

Every layer keeps its own head count: a pruned layer's attention is traced with its narrower
projections, and a layer without heads (whose attention is bypassed) becomes its output bias.

References
----------
CAHP paper, Section IV-B.5 (the pruned model and its speed).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from cahp_engine._validation import check_positive_int
from cahp_engine.data import EncodedDataset, collate, draw_subset
from cahp_engine.errors import (
    ConfigError,
    DatasetError,
    ExportParityError,
    PipelineError,
    UnsupportedModelError,
)
from cahp_engine.export._records import OnnxExport, Parity
from cahp_engine.export._runtime import ONNX_FILE, _feed, file_size, onnx_session, runtime_versions, session_inputs
from cahp_engine.models import export_attention, heads_per_layer, neurons_per_layer
from cahp_engine.recovery import max_positions

#: The opset of exported graphs: the lowest the torch.export-based exporter writes.
OPSET = 18
#: Largest tolerated absolute difference between onnxruntime's and PyTorch's logits.
PARITY_THRESHOLD = 1e-4
#: Samples compared by the parity check.
PARITY_SAMPLES = 64
#: Names of the dynamic axes, as Optimum names them.
BATCH_AXIS, SEQUENCE_AXIS = "batch_size", "sequence_length"
MODEL_FILES = (ONNX_FILE, ONNX_FILE + ".data", ONNX_FILE + "_data")
_PADDING_SIDES = ("right", "left")


# --------------------------------------------------------------------------- export


def onnx_input_names(model: nn.Module) -> tuple[str, ...]:
    """The inputs an export of ``model`` takes, with Hugging Face's names.

    ``input_ids`` and ``attention_mask``, then ``token_type_ids`` when the forward takes it and the
    config has more than one token type: RoBERTa and XLM-R checkpoints (``type_vocab_size`` 1) embed
    every token as type 0, so, as in Optimum's exports, the input is left out and their tokenizers,
    which return no token types, feed the graph as they are.
    """
    accepted = inspect.signature(model.forward).parameters
    names = ["input_ids", "attention_mask"]
    if "token_type_ids" in accepted and int(getattr(model.config, "type_vocab_size", 0) or 0) > 1:
        names.append("token_type_ids")
    return tuple(names)


class _LogitsOnly(nn.Module):
    """Positional tensors in ``names`` order -> logits: the signature the exporter traces."""

    def __init__(self, model: nn.Module, names: tuple[str, ...]) -> None:
        super().__init__()
        self.model = model
        self.names = names

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        return self.model(**dict(zip(self.names, tensors, strict=True))).logits


def export_onnx(
    model: nn.Module,
    tokenizer: Any,
    out_dir: str | Path,
    *,
    data: EncodedDataset | None = None,
    check: bool = True,
    samples: int = PARITY_SAMPLES,
    threshold: float = PARITY_THRESHOLD,
    seed: int = 0,
    exported: Callable[[], None] | None = None,
) -> OnnxExport:
    """Write ``model`` as ``model.onnx`` with its config and tokenizer into ``out_dir``, and check it.

    Parameters
    ----------
    model : a ``*ForSequenceClassification`` model, pruned or not
        Exported from a float32 CPU copy in eval mode; the model itself is left as it is.
    tokenizer : its tokenizer (anything with ``save_pretrained``), or None to write no tokenizer files
    out_dir : directory, created if needed; files of the same names are overwritten
    data : EncodedDataset, optional
        Rows for the parity check; random token ids when None.
    check : bool
        Run :func:`check_parity` (on by default; a graph that does not reproduce the model is useless).
    samples, threshold, seed
        Passed to :func:`check_parity`.
    exported : callable, optional
        Called once the files are written, before the parity check (a step of the caller's progress).

    Returns
    -------
    OnnxExport

    Raises
    ------
    ExportParityError
        If the parity check fails; the files stay in ``out_dir`` for inspection.
    PipelineError
        If the exporter cannot trace the model.
    """
    started = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = onnx_input_names(model)
    reference = _cpu_float_copy(model)
    config: Any = reference.config
    graph = out / ONNX_FILE
    for stale in MODEL_FILES:
        (out / stale).unlink(missing_ok=True)
    # Traced with the attention the exporter translates exactly (ModernBERT's sliding windows); the
    # parity check below runs the model as it was given.
    with export_attention(reference):
        _export_graph(_LogitsOnly(reference, names).eval(), _example_inputs(config, names), names, graph)
    saved: Any = copy.deepcopy(model.config)
    saved.architectures = [type(model).__name__]
    saved.save_pretrained(out)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    export_s = time.perf_counter() - started
    if exported is not None:
        exported()
    parity = None
    if check:
        parity = check_parity(reference, graph, data=data, samples=samples, threshold=threshold, seed=seed)
    try:
        heads: tuple[int, ...] | None = tuple(heads_per_layer(model))
        neurons: tuple[int, ...] | None = tuple(neurons_per_layer(model))
    except UnsupportedModelError:
        heads = neurons = None
    return OnnxExport(
        path=str(out),
        model_file=ONNX_FILE,
        files=tuple(sorted(p.name for p in out.iterdir() if p.is_file())),
        inputs=names,
        outputs=("logits",),
        dynamic_axes=(BATCH_AXIS, SEQUENCE_AXIS),
        opset=OPSET,
        num_labels=int(config.num_labels),
        heads_per_layer=heads,
        size_bytes=file_size(graph),
        export_s=export_s,
        exporter=f"torch.onnx.export(dynamo=True), torch {torch.__version__}",
        versions=runtime_versions(),
        parity=parity,
        neurons_per_layer=neurons,
    )


def _cpu_float_copy(model: nn.Module) -> nn.Module:
    # deepcopy keeps a head-less layer's bypass: its forward is bound to the copied module.
    return copy.deepcopy(model).to(device="cpu", dtype=torch.float32).eval()


def _example_inputs(config: Any, names: tuple[str, ...]) -> tuple[torch.Tensor, ...]:
    """A (3, 11) batch whose last row is padded, so masking is traced as data, not as a constant.

    The sizes avoid 0 and 1, which torch.export would specialise, and the model's own widths.
    """
    rows = generated_rows(config, 3, seed=0, token_types="token_type_ids" in names, max_len=2)
    ids = np.tile(np.asarray(rows.input_ids[0][:1] * 11, dtype=np.int64), (3, 1))
    mask = np.ones_like(ids)
    mask[2, 8:] = 0
    tensors = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    return tuple(torch.from_numpy(tensors[name]) for name in names)


def _export_graph(wrapper: nn.Module, example: tuple[torch.Tensor, ...], names: tuple[str, ...], path: Path) -> None:
    axes = {0: BATCH_AXIS, 1: SEQUENCE_AXIS}
    try:
        with _quiet_exporter():
            program = torch.onnx.export(
                wrapper,
                example,
                None,
                input_names=list(names),
                output_names=["logits"],
                opset_version=OPSET,
                dynamo=True,
                dynamic_shapes=(tuple(dict(axes) for _ in names),),
                optimize=True,
                verbose=False,
            )
    except Exception as exc:  # the exporter raises many types; all mean "could not trace this model"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PipelineError(f"the ONNX exporter could not trace the model: {first}") from exc
    if program is None:  # only when the legacy exporter is asked for
        raise PipelineError("torch.onnx.export returned no program")
    # Above 2 GiB the weights go to model.onnx.data beside the graph (protobuf's size limit).
    program.save(str(path))


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """Silence the exporter's diagnostics (deprecations inside torch, axis-naming notes, a log
    line per torchvision operator it cannot register). Parity, not the exporter's chatter, is what
    says whether the graph is right."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(action="ignore"):
            yield
    finally:
        logger.setLevel(level)


# --------------------------------------------------------------------------- parity


def generated_rows(
    config: Any, n: int, *, seed: int, token_types: bool = False, max_len: int = 32
) -> EncodedDataset:
    """``n`` rows of random token ids, for checks when no dataset is at hand.

    Parameters
    ----------
    config : the model's config (vocabulary, special ids, positions, number of labels)
    n : int
    seed : int
    token_types : bool
        Give each row a second segment of token type 1 (its second half), as sentence pairs have.
    max_len : int
        Rows are 2..max_len tokens long (capped by the model's positions), drawn uniformly.

    Returns
    -------
    EncodedDataset
        Ids drawn from the vocabulary minus the special ids (as the latency inputs are), labels 0.
    """
    check_positive_int("n", n)
    vocab = int(config.vocab_size)
    special = {
        int(i)
        for name in ("pad_token_id", "bos_token_id", "eos_token_id", "sep_token_id", "cls_token_id")
        if (i := getattr(config, name, None)) is not None
    }
    candidates = np.asarray([i for i in range(vocab) if i not in special] or list(range(vocab)), dtype=np.int64)
    rng = np.random.default_rng(seed)
    longest = max(2, min(max_len, max_positions(config)))
    lengths = rng.integers(2, longest + 1, size=n)
    ids = tuple(tuple(int(t) for t in rng.choice(candidates, size=int(k))) for k in lengths)
    types = tuple(tuple(0 if j < k // 2 else 1 for j in range(k)) for k in lengths) if token_types else None
    return EncodedDataset(
        input_ids=ids,
        token_type_ids=types,
        labels=np.zeros(n, dtype=np.int64),
        lengths=lengths.astype(np.int64),
        num_classes=int(getattr(config, "num_labels", 2)),
        pad_token_id=int(getattr(config, "pad_token_id", None) or 0),
    )


def check_parity(
    model: nn.Module,
    onnx_path: str | Path,
    *,
    data: EncodedDataset | None = None,
    samples: int = PARITY_SAMPLES,
    threshold: float | None = PARITY_THRESHOLD,
    seed: int = 0,
    batch_size: int = 16,
    threads: int | None = None,
) -> Parity:
    """Compare onnxruntime's logits with the PyTorch model's on the same padded batches.

    Parameters
    ----------
    model : the ``*ForSequenceClassification`` model the graph was exported from
        Run in float32 on the CPU (a copy when it lives elsewhere), in eval mode, under ``no_grad``.
    onnx_path : the graph, or the directory holding ``model.onnx``
    data : EncodedDataset, optional
        ``min(samples, len(data))`` rows are drawn from it with ``seed``; without it, ``samples`` rows
        of random token ids (:func:`generated_rows`).
    samples : int
    threshold : float or None
        The largest tolerated absolute logit difference; None only measures.
    seed : int
    batch_size : int
        Rows per batch. Batches mix lengths, so most rows carry padding; every batch is run padded
        on the right and again on the left.
    threads : onnxruntime intra-op threads

    Returns
    -------
    Parity

    Raises
    ------
    ExportParityError
        If ``max_abs_diff`` exceeds ``threshold`` (or is not a number); its ``parity`` attribute
        holds the measurement.
    """
    check_positive_int("samples", samples)
    check_positive_int("batch_size", batch_size)
    if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))
                                  or not threshold > 0):
        raise ConfigError(f"`threshold` must be a number > 0 or None, got {threshold!r}")
    session = onnx_session(onnx_path, threads=threads)
    names = session_inputs(session)
    reference = model if _is_cpu_float(model) else _cpu_float_copy(model)
    if data is not None:
        if len(data) == 0:
            raise DatasetError("the parity rows are empty; give at least one encoded sample or none at all")
        rows, source = data, "data"
        indices = draw_subset(len(data), min(samples, len(data)), seed=seed)
        # draw_subset sorts; shuffle so that batches mix lengths and carry padding.
        indices = np.random.default_rng(seed).permutation(indices)
    else:
        rows = generated_rows(reference.config, samples, seed=seed, token_types="token_type_ids" in names)
        source, indices = "generated", np.arange(samples)

    diffs: list[np.ndarray] = []
    agree: list[np.ndarray] = []
    was_training = reference.training
    reference.eval()
    try:
        with torch.no_grad():
            for side in _PADDING_SIDES:
                for start in range(0, len(indices), batch_size):
                    feed = _feed(names, collate(rows, indices[start : start + batch_size], padding_side=side))
                    expected = reference(**{k: torch.from_numpy(v) for k, v in feed.items()}).logits.numpy()
                    got = np.asarray(session.run(["logits"], feed)[0])
                    diffs.append(np.abs(got.astype(np.float64) - expected.astype(np.float64)).reshape(-1))
                    agree.append(got.argmax(axis=-1) == expected.argmax(axis=-1))
    finally:
        reference.train(was_training)
    every = np.concatenate(diffs)
    max_diff = float(every.max()) if not np.isnan(every).any() else float("nan")
    passed = threshold is None or max_diff <= threshold
    parity = Parity(
        max_abs_diff=max_diff,
        mean_abs_diff=float(every.mean()),
        prediction_agreement=float(np.concatenate(agree).mean()),
        threshold=None if threshold is None else float(threshold),
        passed=bool(passed),
        samples=len(indices),
        source=source,
        padding_sides=_PADDING_SIDES,
    )
    if not passed:
        raise ExportParityError(
            f"the ONNX graph does not reproduce the PyTorch model: onnxruntime's logits differ by up to "
            f"{max_diff:.3g} on {len(indices)} {source} samples (threshold {threshold:g}); "
            "the export is not safe to serve",
            parity,
        )
    return parity


def _is_cpu_float(model: nn.Module) -> bool:
    return all(p.device.type == "cpu" and p.dtype == torch.float32 for p in model.parameters())
