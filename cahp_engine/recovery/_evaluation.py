"""Accuracy, size and speed of a classifier, dense or pruned.

:func:`evaluate` scores a model on an encoded split, :func:`count_parameters` sizes it and its
attention blocks, and :func:`measure_latency` / :func:`compare_speed` time its forward pass on random
inputs of a fixed shape. Every result is a small frozen dataclass of :mod:`._evaluation_records` with
a JSON-ready ``to_dict()``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from sklearn.metrics import accuracy_score, confusion_matrix, f1_score
from torch import nn

from cahp_engine._torch import as_device, model_inputs, num_parameters
from cahp_engine._validation import Interval, check
from cahp_engine.data import EncodedDataset, iterate_batches, length_grouped_batches
from cahp_engine.errors import ConfigError, DatasetError, InvalidInputError
from cahp_engine.models import get_adapter, heads_per_layer
from cahp_engine.recovery._evaluation_records import (
    ClassificationMetrics,
    Latency,
    ParameterCounts,
    SpeedComparison,
    SpeedRow,
)

__all__ = [
    "ClassificationMetrics",
    "Latency",
    "ParameterCounts",
    "SpeedComparison",
    "SpeedRow",
    "as_device",
    "compare_speed",
    "count_parameters",
    "evaluate",
    "check_counts",
    "latency_of",
    "max_positions",
    "measure_latency",
    "model_inputs",
    "random_inputs",
    "speedup_interval",
]

_AT_LEAST_ONE = Interval("integer", 1, None, closed="left")
_AT_LEAST_ZERO = Interval("integer", 0, None, closed="left")


# --------------------------------------------------------------------------- accuracy


def evaluate(
    model: nn.Module, data: EncodedDataset, *, batch_size: int = 64, device: torch.device | str = "cpu"
) -> ClassificationMetrics:
    """Accuracy, macro-F1 and confusion matrix of ``model`` on ``data``.

    Parameters
    ----------
    model : a ``*ForSequenceClassification`` model
        Moved to ``device`` in place; run in eval mode under ``no_grad`` and left in the training
        mode it came in.
    data : EncodedDataset of n samples
    batch_size : int
        Samples per forward pass; batches are grouped by length, shortest first, without shuffling.

    Returns
    -------
    ClassificationMetrics
        Macro-F1 averages over the classes that occur in the labels or the predictions
        (scikit-learn's default), counting an undefined F1 as 0.
    """
    return classification_metrics(data.labels, predict(model, data, batch_size=batch_size, device=device),
                                  data.num_classes)


def predict(
    model: nn.Module, data: EncodedDataset, *, batch_size: int = 64, device: torch.device | str = "cpu"
) -> np.ndarray:
    """The class ``model`` predicts for each row of ``data``, as :func:`evaluate` runs it.

    Returns
    -------
    ndarray of shape (n,), int64
        Row ``i`` is sample ``i``'s prediction (argmax of the logits).
    """
    check("batch_size", batch_size, _AT_LEAST_ONE)
    if len(data) == 0:
        raise DatasetError("the evaluation split has no rows; give at least one labelled sample")
    dev = as_device(device)
    was_training = model.training
    model.to(dev).eval()
    out = np.empty(len(data), dtype=np.int64)
    batches = length_grouped_batches(data.lengths, np.arange(len(data)), batch_size)
    try:
        with torch.no_grad():
            for idx, batch in zip(batches, iterate_batches(data, batches, dev), strict=True):
                out[idx] = model(**model_inputs(model, batch)).logits.argmax(dim=-1).cpu().numpy()
    finally:
        model.train(was_training)
    return out


def classification_metrics(y_true: np.ndarray, y_pred: np.ndarray, num_classes: int) -> ClassificationMetrics:
    """Accuracy, macro-F1 and confusion matrix of predictions ``y_pred`` (n,) against ``y_true`` (n,).

    Shared by :func:`evaluate` and the onnxruntime evaluation, so both score alike. Macro-F1 averages
    over the classes that occur in the labels or the predictions (scikit-learn's default), counting an
    undefined F1 as 0.
    """
    classes = np.arange(max(num_classes, int(y_pred.max()) + 1, int(y_true.max()) + 1))
    confusion = confusion_matrix(y_true, y_pred, labels=classes)
    support = confusion.sum(axis=1)
    return ClassificationMetrics(
        accuracy=float(accuracy_score(y_true, y_pred)),
        macro_f1=float(f1_score(y_true, y_pred, average="macro", zero_division=0)),
        n=len(y_true),
        confusion=tuple(tuple(int(c) for c in row) for row in confusion),
        recall=tuple(float(confusion[i, i] / support[i]) if support[i] else None for i in range(len(classes))),
    )


# --------------------------------------------------------------------------- size


def count_parameters(model: nn.Module) -> ParameterCounts:
    """Total parameters and those of the attention projections (q, k, v and output, with biases).

    Layers are found through :mod:`cahp_engine.models._adapters`, so pruned models whose layers keep
    different numbers of heads are counted as they are.
    """
    adapter = get_adapter(model)
    attention = 0
    for layer in adapter.layers(model):
        parts = adapter.attention(layer)
        for linear in (*parts.projections, parts.output):
            attention += sum(p.numel() for p in linear.parameters())
    return ParameterCounts(
        total=num_parameters(model), attention=int(attention), heads_per_layer=tuple(heads_per_layer(model))
    )


# --------------------------------------------------------------------------- speed


def max_positions(config: Any) -> int:
    return get_adapter(config).max_positions(config)


def random_inputs(
    model: nn.Module, batch_size: int, seq_len: int, seed: int, dev: torch.device
) -> dict[str, torch.Tensor]:
    """Token ids drawn from the vocabulary minus the config's special ids, with a full mask.

    Pad ids are avoided in particular because RoBERTa derives positions from them.
    """
    config: Any = model.config
    vocab = int(config.vocab_size)
    special = {
        int(i)
        for name in ("pad_token_id", "bos_token_id", "eos_token_id", "sep_token_id", "cls_token_id")
        if (i := getattr(config, name, None)) is not None
    }
    candidates = torch.tensor([i for i in range(vocab) if i not in special], dtype=torch.long)
    if candidates.numel() == 0:
        candidates = torch.arange(vocab)
    gen = torch.Generator().manual_seed(seed)
    pick = torch.randint(len(candidates), (batch_size, seq_len), generator=gen)
    ids = candidates[pick]
    return {"input_ids": ids.to(dev), "attention_mask": torch.ones_like(ids).to(dev)}


class _Timer:
    """Times single forward passes of one model on one fixed input."""

    def __init__(self, model: nn.Module, batch_size: int, seq_len: int, seed: int, dev: torch.device) -> None:
        check("batch_size", batch_size, _AT_LEAST_ONE)
        check("seq_len", seq_len, _AT_LEAST_ONE)
        limit = max_positions(model.config)
        if seq_len > limit:
            raise InvalidInputError(f"`seq_len` must be at most {limit} for this model, got {seq_len}")
        self.model = model
        self.dev = dev
        self.inputs = random_inputs(model, batch_size, seq_len, seed, dev)
        self.times_s: list[float] = []

    def run(self, *, record: bool) -> None:
        sync = torch.cuda.synchronize if self.dev.type == "cuda" else (lambda: None)
        sync()
        start = time.perf_counter()
        self.model(**self.inputs)
        sync()
        if record:
            self.times_s.append(time.perf_counter() - start)

    def result(self, batch_size: int, seq_len: int, warmup: int) -> Latency:
        return latency_of(self.times_s, batch_size=batch_size, seq_len=seq_len, warmup=warmup, device=str(self.dev))


def latency_of(seconds: Sequence[float], *, batch_size: int, seq_len: int, warmup: int, device: str) -> Latency:
    """The :class:`Latency` of timed passes of ``seconds`` each: median, spread (p25, p75), p95, mean."""
    ms = np.asarray(seconds, dtype=np.float64) * 1e3
    mean = float(ms.mean())
    return Latency(
        batch_size=batch_size,
        seq_len=seq_len,
        p50_ms=float(np.percentile(ms, 50)),
        p95_ms=float(np.percentile(ms, 95)),
        mean_ms=mean,
        throughput_per_s=batch_size / (mean / 1e3),
        warmup=warmup,
        repeats=len(ms),
        device=device,
        p25_ms=float(np.percentile(ms, 25)),
        p75_ms=float(np.percentile(ms, 75)),
    )


#: Resamples of the rounds behind each speed-up's interval.
SPEEDUP_RESAMPLES = 2000


def speedup_interval(
    baseline_s: Sequence[float], candidate_s: Sequence[float], *, seed: int = 0, resamples: int = SPEEDUP_RESAMPLES
) -> tuple[float, float]:
    """The 95 % interval of a speed-up (baseline median over candidate median) over interleaved rounds.

    Parameters
    ----------
    baseline_s, candidate_s : sequences of n seconds
        Round ``i`` of each was timed back to back (the interleaving of :func:`compare_speed`), so a
        round is resampled as a pair: a load burst that slowed both stays in both.
    seed : int
        Seeds the resampling, so a report's interval is reproducible from its timings.

    Returns
    -------
    (low, high) : the 2.5th and 97.5th percentiles of the resampled speed-ups. An interval that holds
        1 means the two cannot be told apart at this noise (:func:`~cahp_engine.export.describe_speedup`).
    """
    base = np.asarray(baseline_s, dtype=np.float64)
    cand = np.asarray(candidate_s, dtype=np.float64)
    if base.shape != cand.shape or base.ndim != 1 or base.size == 0:
        raise InvalidInputError(f"the two timings must be paired rounds of the same length, got {base.shape} and "
                                f"{cand.shape}")
    picks = np.random.default_rng(seed).integers(0, base.size, size=(resamples, base.size))
    ratios = np.median(base[picks], axis=1) / np.median(cand[picks], axis=1)
    low, high = np.percentile(ratios, [2.5, 97.5])
    return float(low), float(high)


def check_counts(warmup: int, repeats: int) -> None:
    check("warmup", warmup, _AT_LEAST_ZERO)
    check("repeats", repeats, _AT_LEAST_ONE)


def _timed(models: Sequence[nn.Module], body: Callable[[], Any]) -> Any:
    """Run ``body`` with every model in eval mode under ``no_grad``, restoring their modes after."""
    modes = [m.training for m in models]
    for m in models:
        m.eval()
    try:
        with torch.no_grad():
            return body()
    finally:
        for m, mode in zip(models, modes, strict=True):
            m.train(mode)


def measure_latency(
    model: nn.Module,
    *,
    batch_size: int,
    seq_len: int,
    device: torch.device | str = "cpu",
    warmup: int = 3,
    repeats: int = 20,
    seed: int = 0,
) -> Latency:
    """Forward-pass latency of ``model`` on random inputs of shape (batch_size, seq_len).

    The model is moved to ``device`` in place. Each timed pass is bracketed by CUDA
    synchronisation on a GPU, so it measures finished work rather than queued kernels.
    ``throughput_per_s`` is samples per second at the mean latency.
    """
    check_counts(warmup, repeats)
    dev = as_device(device)
    model.to(dev)
    timer = _Timer(model, batch_size, seq_len, seed, dev)

    def body() -> Latency:
        for _ in range(warmup):
            timer.run(record=False)
        for _ in range(repeats):
            timer.run(record=True)
        return timer.result(batch_size, seq_len, warmup)

    latency: Latency = _timed([model], body)
    return latency


def compare_speed(
    dense: nn.Module,
    pruned: nn.Module,
    *,
    batch_sizes: Sequence[int] = (1, 32),
    seq_len: int = 64,
    device: torch.device | str = "cpu",
    warmup: int = 3,
    repeats: int = 20,
    seed: int = 0,
) -> SpeedComparison:
    """Latency of a dense model and its pruned copy, and the speed-up, per batch size.

    Both models see the same random inputs. Their timed passes alternate (dense then pruned, then
    pruned then dense, ...) so drifts in machine load hit both alike.

    Returns
    -------
    SpeedComparison
        One :class:`SpeedRow` per batch size, in order: the dense and pruned :class:`Latency` and
        ``speedup`` = dense p50 / pruned p50.
    """
    check_counts(warmup, repeats)
    if not batch_sizes:
        raise ConfigError("`batch_sizes` must name at least one batch size, got an empty sequence")
    dense_config: Any = dense.config
    pruned_config: Any = pruned.config
    if int(dense_config.vocab_size) != int(pruned_config.vocab_size):
        raise InvalidInputError(
            f"the two models have different vocabularies ({dense_config.vocab_size} and "
            f"{pruned_config.vocab_size} tokens); compare a model with a pruned copy of itself"
        )
    dev = as_device(device)
    dense.to(dev)
    pruned.to(dev)

    def body() -> tuple[SpeedRow, ...]:
        rows = []
        for bs in batch_sizes:
            timers = [_Timer(dense, bs, seq_len, seed, dev), _Timer(pruned, bs, seq_len, seed, dev)]
            for _ in range(warmup):
                for timer in timers:
                    timer.run(record=False)
            for rep in range(repeats):
                for timer in timers if rep % 2 == 0 else timers[::-1]:
                    timer.run(record=True)
            lat_dense, lat_pruned = (t.result(bs, seq_len, warmup) for t in timers)
            low, high = speedup_interval(timers[0].times_s, timers[1].times_s, seed=seed)
            rows.append(SpeedRow(batch_size=int(bs), dense=lat_dense, pruned=lat_pruned,
                                 speedup=lat_dense.p50_ms / lat_pruned.p50_ms, speedup_low=low, speedup_high=high))
        return tuple(rows)

    results = _timed([dense, pruned], body)
    return SpeedComparison(device=str(dev), seq_len=seq_len, warmup=warmup, repeats=repeats, results=results)
