"""Running exported classifiers in onnxruntime on the CPU: sessions, accuracy and latency.

:func:`onnx_session` opens a graph written by :func:`cahp_engine.export.export_onnx`,
:func:`run_logits` feeds it a collated batch, :func:`evaluate_onnx` scores it on an encoded split the
way :func:`cahp_engine.recovery.evaluate` scores a PyTorch model, and :func:`compare_runtimes` times
onnxruntime graphs and PyTorch models side by side with the protocol of
:func:`cahp_engine.recovery.compare_speed`.
"""

from __future__ import annotations

import copy
import functools
import time
import types
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch
import transformers
from torch import nn

from cahp_engine._torch import model_inputs
from cahp_engine._validation import check_positive_int
from cahp_engine.data import EncodedDataset, collate, length_grouped_batches
from cahp_engine.errors import ConfigError, DatasetError, InvalidInputError, ModelLoadError
from cahp_engine.export._records import RuntimeLatencies, RuntimeSpeed
from cahp_engine.recovery import (
    ClassificationMetrics,
    check_counts,
    classification_metrics,
    latency_of,
    max_positions,
    random_inputs,
    speedup_interval,
)

#: Name of the graph file in an exported directory, as Optimum names it.
ONNX_FILE = "model.onnx"
_CONFIG_FILE = "config.json"


def onnx_session(path: str | Path, *, threads: int | None = None) -> ort.InferenceSession:
    """Open an ONNX graph for CPU inference.

    Parameters
    ----------
    path : the ``model.onnx`` file, or the directory that holds it
    threads : int, optional
        onnxruntime's intra-op threads; by default as many as torch uses (``torch.get_num_threads()``),
        so PyTorch and onnxruntime figures compare like for like. Inter-op parallelism is off.

    Notes
    -----
    Every graph optimisation onnxruntime has (``ORT_ENABLE_ALL``) is on: that is what a deployer gets
    from ``InferenceSession(path)`` with default options.
    """
    file = resolve_onnx_file(path)
    if threads is not None:
        check_positive_int("threads", threads)
    options = ort.SessionOptions()
    options.intra_op_num_threads = int(threads or torch.get_num_threads())
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Warnings such as unused initializers of a head-less layer are not the user's concern.
    options.log_severity_level = 3
    try:
        return ort.InferenceSession(str(file), sess_options=options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own exception types, all derived from Exception
        raise ModelLoadError(f"onnxruntime cannot load {str(file)!r}: {exc}") from exc


def resolve_onnx_file(path: str | Path) -> Path:
    """``path`` itself when it is a file, else ``path/model.onnx``; raises ModelLoadError when missing."""
    file = Path(path)
    if file.is_dir():
        file = file / ONNX_FILE
    if not file.is_file():
        raise ModelLoadError(f"no ONNX graph at {str(file)!r}; point at a directory written by export_onnx")
    return file


def session_inputs(session: ort.InferenceSession) -> tuple[str, ...]:
    """The graph's input names, in order."""
    return tuple(i.name for i in session.get_inputs())


def run_logits(session: ort.InferenceSession, batch: Mapping[str, torch.Tensor | np.ndarray]) -> np.ndarray:
    """Logits of one batch.

    Parameters
    ----------
    session : an exported classifier
    batch : mapping with at least ``input_ids`` and ``attention_mask`` of shape (B, T)
        Keys the graph does not take (``labels``, ``token_type_ids`` of a model without token types)
        are dropped; a ``token_type_ids`` input the batch lacks is fed zeros.

    Returns
    -------
    ndarray of shape (B, C), float32
    """
    feed = _feed(session_inputs(session), batch)
    return np.asarray(session.run(["logits"], feed)[0])


def run_logits_rowwise(session: ort.InferenceSession, batch: Mapping[str, torch.Tensor | np.ndarray]) -> np.ndarray:
    """Logits of one batch, each row run alone on its own tokens: answers that do not depend on the batch.

    Dynamic int8 takes each product's activation scale from its whole input, the other rows and their
    padding included, so a row's class can change with the rows batched with it. Run a row at a time
    without its padding, it cannot. On one thread it was also faster than padded batches on real
    sentences (no work on padding; docs/performance.md).

    Parameters
    ----------
    session : an exported classifier
    batch : mapping with at least ``input_ids`` and ``attention_mask`` of shape (B, T)
        Padding on either side: each row keeps the positions its mask marks.

    Returns
    -------
    ndarray of shape (B, C), float32
    """
    names = session_inputs(session)
    feed = _feed(names, batch)
    mask = feed["attention_mask"] if "attention_mask" in feed else _numpy(batch["attention_mask"])
    rows = []
    for i in range(mask.shape[0]):
        keep = np.flatnonzero(mask[i]) if mask[i].any() else np.arange(mask.shape[1])
        one = {name: value[i : i + 1, keep] for name, value in feed.items()}
        rows.append(np.asarray(session.run(["logits"], one)[0]))
    return np.concatenate(rows) if rows else np.zeros((0, 0), dtype=np.float32)


def _feed(names: Sequence[str], batch: Mapping[str, torch.Tensor | np.ndarray]) -> dict[str, np.ndarray]:
    feed: dict[str, np.ndarray] = {}
    for name in names:
        value = batch.get(name)
        if value is None:
            if name != "token_type_ids":
                raise InvalidInputError(f"the ONNX graph needs the input {name!r}, which the batch lacks")
            value = np.zeros_like(_numpy(batch["input_ids"]))
        feed[name] = _numpy(value).astype(np.int64, copy=False)
    return feed


def _numpy(value: torch.Tensor | np.ndarray) -> np.ndarray:
    return value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)


# --------------------------------------------------------------------------- accuracy


def evaluate_onnx(
    path: str | Path | ort.InferenceSession, data: EncodedDataset, *, batch_size: int = 64, threads: int | None = None,
    rowwise: bool = False, progress: Callable[[int, int], None] | None = None,
) -> ClassificationMetrics:
    """Accuracy, macro-F1 and confusion matrix of an exported classifier on ``data``.

    Parameters
    ----------
    path : the graph (file or directory), or an open session
    data : EncodedDataset of n samples
        Batched as :func:`cahp_engine.recovery.evaluate` batches it (grouped by length, shortest
        first), padded on the tokenizer's side.
    batch_size : int
    threads : onnxruntime intra-op threads (see :func:`onnx_session`)
    rowwise : bool
        Score each row alone on its own tokens (:func:`run_logits_rowwise`): dynamic int8's accuracy as a
        deployment that runs it a row at a time gets it, the same whatever the batch.
    progress : callable (done, total), optional
        Told the rows scored so far and the rows to score after every batch.
    """
    check_positive_int("batch_size", batch_size)
    if len(data) == 0:
        raise DatasetError("the evaluation split has no rows; give at least one labelled sample")
    session = path if isinstance(path, ort.InferenceSession) else onnx_session(path, threads=threads)
    order: list[np.ndarray] = []
    predictions: list[np.ndarray] = []
    scored = 0
    for idx in length_grouped_batches(data.lengths, np.arange(len(data)), batch_size):
        run = run_logits_rowwise if rowwise else run_logits
        predictions.append(run(session, collate(data, idx)).argmax(axis=-1))
        order.append(idx)
        scored += len(idx)
        if progress is not None:
            progress(scored, len(data))
    return classification_metrics(data.labels[np.concatenate(order)], np.concatenate(predictions), data.num_classes)


# --------------------------------------------------------------------------- speed


def compare_runtimes(
    onnx: Mapping[str, str | Path],
    *,
    torch_models: Mapping[str, nn.Module] | None = None,
    baseline: str | None = None,
    batch_sizes: Sequence[int] = (1, 32),
    seq_len: int = 64,
    warmup: int = 3,
    repeats: int = 20,
    seed: int = 0,
    threads: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> RuntimeSpeed:
    """CPU latency of exported graphs and PyTorch models on the same random inputs, and speed-ups.

    Parameters
    ----------
    onnx : mapping of name -> exported directory (or its ``model.onnx``)
        Each directory needs its ``config.json`` (written by the exporter) for the vocabulary.
    torch_models : mapping of name -> ``*ForSequenceClassification`` model, optional
        Timed in eval mode under ``no_grad``, on the CPU (a model elsewhere is timed as a CPU copy).
    baseline : the name speed-ups are relative to; the first PyTorch model, else the first graph
    batch_sizes, seq_len, warmup, repeats, seed
        As in :func:`cahp_engine.recovery.compare_speed`: every candidate sees the same random token
        ids (the vocabulary minus special ids) with a full attention mask, of shape (batch, seq_len);
        ``warmup`` untimed then ``repeats`` timed passes, the candidates' passes interleaved, in
        reversed order every other round, so drifts in machine load hit all alike.
    threads : int, optional
        Intra-op threads of onnxruntime, and of torch while timing; by default torch's current
        setting, which is restored afterwards.
    progress : callable (done, total), optional
        Told after every pass of all the candidates, warm-up passes included, in rows: a pass at batch
        size 32 counts 32, so ``done / total`` follows the work rather than the number of passes.

    Returns
    -------
    RuntimeSpeed
    """
    torch_models = dict(torch_models or {})
    names = list(torch_models) + list(onnx)
    if not names:
        raise ConfigError("`onnx` and `torch_models` name no candidate to time")
    if len(set(names)) != len(names):
        raise ConfigError(f"candidate names must be distinct across `onnx` and `torch_models`, got {names}")
    chosen = baseline if baseline is not None else names[0]
    if chosen not in names:
        raise ConfigError(f"`baseline` must be one of {names}, got {baseline!r}")
    check_counts(warmup, repeats)
    check_positive_int("seq_len", seq_len)
    if not batch_sizes:
        raise ConfigError("`batch_sizes` must name at least one batch size, got an empty sequence")
    for bs in batch_sizes:
        check_positive_int("batch_size", bs)
    n_threads = int(threads or torch.get_num_threads())
    check_positive_int("threads", n_threads)

    sessions = {name: onnx_session(path, threads=n_threads) for name, path in onnx.items()}
    configs: list[Any] = [m.config for m in torch_models.values()] + [_graph_config(p) for p in onnx.values()]
    # random_inputs reads only ``.config``; the first candidate's decides the vocabulary and special ids.
    holder: Any = types.SimpleNamespace(config=configs[0])
    if len({int(c.vocab_size) for c in configs}) > 1:
        raise InvalidInputError("the candidates have different vocabularies; compare a model with its own exports")
    limit = min(max_positions(c) for c in configs)
    if seq_len > limit:
        raise InvalidInputError(f"`seq_len` must be at most {limit} for these models, got {seq_len}")
    cpu_models = {name: _on_cpu(model) for name, model in torch_models.items()}
    runtimes = dict.fromkeys(cpu_models, f"torch {torch.__version__}") | dict.fromkeys(
        sessions, f"onnxruntime {ort.__version__}"
    )

    previous_threads = torch.get_num_threads()
    modes = {name: m.training for name, m in cpu_models.items()}
    rows = []
    try:
        torch.set_num_threads(n_threads)
        for m in cpu_models.values():
            m.eval()
        passes = _Passes(progress, sum(int(bs) for bs in batch_sizes) * (warmup + repeats))
        with torch.no_grad():
            for bs in batch_sizes:
                inputs = random_inputs(holder, int(bs), seq_len, seed, torch.device("cpu"))
                runners = {name: _torch_runner(m, inputs) for name, m in cpu_models.items()}
                runners |= {name: _onnx_runner(s, inputs) for name, s in sessions.items()}
                rows.append(_time_round(runners, int(bs), seq_len, warmup, repeats, chosen, seed,
                                        passed=functools.partial(passes.add, int(bs))))
    finally:
        torch.set_num_threads(previous_threads)
        for name, m in cpu_models.items():
            m.train(modes[name])
    return RuntimeSpeed(device="cpu", seq_len=seq_len, warmup=warmup, repeats=repeats, threads=n_threads,
                        baseline=chosen, runtimes=runtimes, results=tuple(rows))


def _graph_config(path: str | Path) -> Any:
    directory = resolve_onnx_file(path).parent
    if not (directory / _CONFIG_FILE).is_file():
        raise ModelLoadError(f"{str(directory)!r} has no {_CONFIG_FILE}; point at a directory written by export_onnx")
    return transformers.AutoConfig.from_pretrained(directory)


def _on_cpu(model: nn.Module) -> nn.Module:
    if all(p.device.type == "cpu" for p in model.parameters()):
        return model
    return copy.deepcopy(model).cpu()


def _torch_runner(model: nn.Module, inputs: dict[str, torch.Tensor]) -> Callable[[], Any]:
    feed = model_inputs(model, inputs)
    return lambda: model(**feed)


def _onnx_runner(session: ort.InferenceSession, inputs: dict[str, torch.Tensor]) -> Callable[[], Any]:
    feed = _feed(session_inputs(session), inputs)
    return lambda: session.run(["logits"], feed)


class _Passes:
    """The rows :func:`compare_runtimes` has timed so far, told to its ``progress`` after each pass."""

    def __init__(self, progress: Callable[[int, int], None] | None, total: int) -> None:
        self._progress, self._total, self._done = progress, total, 0

    def add(self, rows: int) -> None:
        self._done += rows
        if self._progress is not None:
            self._progress(self._done, self._total)


def _time_round(
    runners: dict[str, Callable[[], Any]], batch_size: int, seq_len: int, warmup: int, repeats: int, baseline: str,
    seed: int, passed: Callable[[], None] = lambda: None,
) -> RuntimeLatencies:
    times: dict[str, list[float]] = {name: [] for name in runners}
    order = list(runners)
    for _ in range(warmup):
        for name in order:
            runners[name]()
        passed()
    for rep in range(repeats):
        for name in order if rep % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            runners[name]()
            times[name].append(time.perf_counter() - start)
        passed()
    latency = {name: latency_of(values, batch_size=batch_size, seq_len=seq_len, warmup=warmup, device="cpu")
               for name, values in times.items()}
    reference = latency[baseline].p50_ms
    intervals = {name: speedup_interval(times[baseline], values, seed=seed) for name, values in times.items()}
    return RuntimeLatencies(
        batch_size=batch_size,
        latency=latency,
        speedup={name: reference / lat.p50_ms for name, lat in latency.items()},
        speedup_low={name: low for name, (low, _) in intervals.items()},
        speedup_high={name: high for name, (_, high) in intervals.items()},
    )


def runtime_versions() -> dict[str, str | None]:
    """Versions of the ONNX stack, for reports."""
    out: dict[str, str | None] = {}
    for name in ("onnx", "onnxruntime", "onnxscript", "torch"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def file_size(path: Path) -> int:
    """Bytes of an ONNX graph together with its external-data file, when it has one."""
    total = path.stat().st_size
    for extra in (path.with_name(path.name + ".data"), path.with_name(path.name + "_data")):
        if extra.is_file():
            total += extra.stat().st_size
    return total

