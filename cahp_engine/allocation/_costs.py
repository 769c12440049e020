"""What a layer's heads and neurons cost: FLOPs, and latency measured on this machine.

The cost of a model is linear in what each layer keeps: a fixed part (embeddings, LayerNorms, the
classifier), and per layer a fixed part for each sub-layer that still runs plus a part per head and per
neuron. :func:`flops_costs` fills those coefficients from the architecture; :func:`latency_costs` fits
them by timing the model itself, physically pruned to a few uniform shapes, on the runtime a user serves
with, and caches the fit per machine, model shape, batch and length, so it is measured once.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, cast

import numpy as np
import scipy.optimize
import torch
from torch import nn

from cahp_engine.allocation._runtimes import Runtime, check_runtime, median_seconds, runner
from cahp_engine.errors import InvalidInputError, PipelineError
from cahp_engine.models import get_adapter, prune_heads, prune_neurons

TABLE_FORMAT = 1
#: A fit whose largest relative error on the timed shapes is above this is used once but not cached.
CACHED_FIT_ERROR = 0.10


@dataclass(frozen=True)
class CostModel:
    """Predicted cost = ``fixed + sum over layers of (attention [h > 0] + head * h + ffn [n > 0] + neuron * n)``.

    Attributes
    ----------
    unit : {"flops", "seconds"}
        FLOPs of one forward pass of ``batch_size`` sequences of ``seq_len`` tokens, or its latency.
    fixed, attention, head, ffn, neuron : float
        The coefficients, in ``unit``.
    num_layers, num_heads, num_neurons : int
        The unpruned architecture.
    batch_size, seq_len : int
        The shape the costs are for.
    runtime : str
        ``"analytic"`` for FLOPs, else the runtime timed (``"pytorch"``).
    points : int
        Shapes timed for the fit (0 for FLOPs); ``fit_error`` is the largest relative error of the fit
        on them.
    """

    unit: str
    fixed: float
    attention: float
    head: float
    ffn: float
    neuron: float
    num_layers: int
    num_heads: int
    num_neurons: int
    batch_size: int
    seq_len: int
    runtime: str
    points: int = 0
    fit_error: float = 0.0

    def predict(self, heads: np.ndarray, neurons: np.ndarray) -> float:
        """Cost of keeping ``heads[l]`` heads and ``neurons[l]`` neurons in layer ``l``; arrays of shape (L,)."""
        h, n = np.asarray(heads, dtype=float), np.asarray(neurons, dtype=float)
        per_layer = self.attention * (h > 0) + self.head * h + self.ffn * (n > 0) + self.neuron * n
        return float(self.fixed + np.sum(per_layer))

    @property
    def dense(self) -> float:
        """Cost of the unpruned model."""
        return self.predict(np.full(self.num_layers, self.num_heads), np.full(self.num_layers, self.num_neurons))

    @property
    def floor(self) -> float:
        """Cost of the smallest model an allocation may give: one head and one neuron per layer."""
        ones = np.ones(self.num_layers)
        return self.predict(ones, ones)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def flops_costs(model: nn.Module, *, batch_size: int = 1, seq_len: int = 128) -> CostModel:
    """The encoder's multiply-add FLOPs (2 per multiply-accumulate) as a :class:`CostModel`.

    A head of width ``d`` costs its rows of the q, k, v projections and its columns of the output one
    (``8 T D d``) and its scores and weighted sum (``4 T^2 d``); a neuron costs its row of the input
    projection (one per block of a gated unit) and its column of the output one (``2 T D (blocks + 1)``).
    Embeddings, LayerNorms, softmax and the classifier are left out: at 64-512 tokens they are a few
    per cent, and no allocation changes them. DeBERTa's relative-position terms are not counted.
    """
    adapter = get_adapter(model)
    config = model.config
    d, hidden = adapter.head_dim(config), int(getattr(config, adapter.config_hidden_attr))
    tokens = batch_size * seq_len
    blocks = adapter.ffn_blocks
    return CostModel(
        unit="flops", fixed=0.0, attention=0.0, head=float(tokens * (8 * hidden * d + 4 * seq_len * d)), ffn=0.0,
        neuron=float(2 * tokens * hidden * (blocks + 1)), num_layers=adapter.num_layers(config),
        num_heads=adapter.num_heads(config), num_neurons=adapter.num_neurons(config), batch_size=batch_size,
        seq_len=seq_len, runtime="analytic",
    )


def latency_costs(
    model: nn.Module, *, batch_size: int, seq_len: int, runtime: Runtime = "pytorch", repeats: int = 3,
    rounds: int = 3, cache_dir: str | Path | None = None, clock: Callable[[], float] = time.perf_counter,
) -> CostModel:
    """Fit the :class:`CostModel` of ``model``'s latency on ``runtime`` by timing it at a few shapes.

    Parameters
    ----------
    model : an unpruned supported sequence classifier (left unchanged: copies are pruned)
    batch_size, seq_len : int
        The input shape timed: ``batch_size`` sequences of ``seq_len`` tokens, no padding.
    runtime : {"pytorch", "onnxruntime", "onnxruntime-int8"}
        PyTorch fp32 on the model's device, or the model exported to ONNX (fp32 or dynamic int8) in an
        onnxruntime session, with the thread count the process has (:func:`runner`).
    repeats : int
        Timed passes per shape and round after one warm-up pass; the median is kept.
    rounds : int
        Rounds over all the shapes; each shape's median over the rounds is fitted.
    cache_dir : directory or None
        Where fitted tables are kept, one JSON file per machine, model shape, runtime, threads, batch and
        length; a table found there is returned without timing anything.
    clock : callable returning seconds

    Returns
    -------
    CostModel in seconds, with ``points`` the shapes timed and ``fit_error`` the fit's largest relative error
    (above :data:`CACHED_FIT_ERROR` the table is returned but not cached).

    Raises
    ------
    PipelineError
        If the timings do not grow with the units kept (a broken timer, or a machine too busy to measure).

    Notes
    -----
    Shapes timed, each the same in every layer: the dense model; half of the heads; one head; no
    attention; half, a quarter and one of the neurons; no feed-forward block. Non-negative least squares
    over them gives the five coefficients.

    References
    ----------
    Kwon et al. 2022, Section 4.3 (a latency lookup table measured once per device).
    """
    check_runtime(runtime)
    for name, value in (("batch_size", batch_size), ("seq_len", seq_len), ("repeats", repeats), ("rounds", rounds)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidInputError(f"`{name}` must be an integer >= 1, got {value!r}")
    adapter = get_adapter(model)
    config: Any = model.config
    layers, heads, neurons = adapter.num_layers(config), adapter.num_heads(config), adapter.num_neurons(config)
    limit = adapter.max_positions(config)
    if seq_len > limit:
        raise InvalidInputError(f"`seq_len` must be at most {limit} for this model, got {seq_len}")
    key = _cache_key(model, batch_size=batch_size, seq_len=seq_len, runtime=runtime)
    cached = _read_cache(cache_dir, key)
    if cached is not None:
        return cached

    shapes = [(heads, neurons), (max(1, heads // 2), neurons), (1, neurons), (0, neurons),
              (heads, max(1, neurons // 2)), (heads, max(1, neurons // 4)), (heads, 1), (heads, 0)]
    rows = [[1.0, layers * float(h > 0), layers * h, layers * float(n > 0), layers * n] for h, n in shapes]
    design = np.asarray(rows)
    for attempt in range(_ATTEMPTS):
        # A busy machine can bury a small model's units under its noise: each attempt after the first
        # times twice as many passes and rounds as the one before.
        observed = _time_shapes(model, shapes, batch_size=batch_size, seq_len=seq_len, runtime=runtime,
                                repeats=repeats * 2 ** attempt, rounds=rounds * 2 ** attempt, clock=clock)
        # Non-negative least squares: no part of a model takes negative time, and a fit free to say so
        # (a negative fixed part against large per-unit parts) would predict a floor below zero.
        coef, _ = scipy.optimize.nnls(design, observed)
        if layers * (coef[2] * heads + coef[4] * neurons) >= 0.01 * observed[0]:  # the units: 1 % of dense or more
            break
    else:
        raise PipelineError(
            f"the latency of this model on {runtime} did not grow with the heads and neurons it keeps "
            f"({', '.join(f'{t * 1000:.1f}' for t in observed)} ms over {len(shapes)} shapes, in {_ATTEMPTS} "
            "attempts); the timer or the machine is not measuring the model (time it on a quieter machine, or use "
            "`target_flops`)"
        )
    fit_error = float(np.max(np.abs(design @ coef - observed) / observed))
    costs = CostModel(
        unit="seconds", fixed=float(coef[0]), attention=float(coef[1]), head=float(coef[2]),
        ffn=float(coef[3]), neuron=float(coef[4]), num_layers=layers, num_heads=heads,
        num_neurons=neurons, batch_size=batch_size, seq_len=seq_len, runtime=runtime, points=len(shapes),
        fit_error=fit_error,
    )
    if fit_error > CACHED_FIT_ERROR:
        return costs  # too noisy to keep: the next call measures again
    _write_cache(cache_dir, key, costs)
    return costs


#: Timings of the shapes taken at most this many times (more passes each time) before the units are said
#: not to grow with the model.
_ATTEMPTS = 3


def _time_shapes(model: nn.Module, shapes: list[tuple[int, int]], *, batch_size: int, seq_len: int,
                 runtime: Runtime, repeats: int, rounds: int, clock: Callable[[], float]) -> np.ndarray:
    """Each shape's median time over ``rounds`` rounds of all the shapes (each ``repeats`` passes)."""
    adapter = get_adapter(model)
    config: Any = model.config
    layers, heads, neurons = adapter.num_layers(config), adapter.num_heads(config), adapter.num_neurons(config)
    generator = torch.Generator().manual_seed(0)
    device = next(model.parameters()).device
    low = int(getattr(config, "pad_token_id", 0) or 0) + 1
    ids = torch.randint(low, int(config.vocab_size), (batch_size, seq_len), generator=generator).to(device)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    # Rounds over all the shapes, the median of each shape's rounds kept: a machine whose load changes
    # during the measurement then slows every shape alike instead of one.
    timings: list[list[float]] = [[] for _ in shapes]
    for _ in range(rounds):
        for index, (h, n) in enumerate(shapes):
            pruned = copy.deepcopy(model).eval()
            if h < heads:
                prune_heads(pruned, {layer: list(range(h)) for layer in range(layers)})
            if n < neurons:
                prune_neurons(pruned, {layer: list(range(n)) for layer in range(layers)})
            with runner(pruned, batch, runtime) as run:
                timings[index].append(median_seconds(run, repeats=repeats, clock=clock))
            del pruned
    return np.asarray([np.median(t) for t in timings])


#: Config entries that do not change a forward pass's time (``problem_type`` is set by the first loss computed).
_NOT_SHAPE = frozenset({"cahp", "_name_or_path", "transformers_version", "problem_type"})


def _cache_key(model: nn.Module, *, batch_size: int, seq_len: int, runtime: str) -> str:
    """A file name that changes with anything that changes the timings: the processor, the device, the model
    shape, the runtime and its version, torch's version and threads, the serving shape.

    Not the host name: a worker in a container gets a new one each time it starts, and would measure the
    same machine's table again; two hosts with the same processor share a table."""
    config = cast(Any, model.config).to_dict()
    shape = {k: config.get(k) for k in sorted(config) if isinstance(config.get(k), int | float | str | bool)
             and k not in _NOT_SHAPE}
    device = next(model.parameters()).device
    identity = json.dumps({
        "format": TABLE_FORMAT, "machine": platform.machine(), "processor": processor_name(),
        "cpus": os.cpu_count(), "torch": torch.__version__, "threads": torch.get_num_threads(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else str(device),
        "runtime": runtime, "runtime_version": _runtime_version(runtime), "batch": batch_size,
        "seq_len": seq_len, "shape": shape,
    }, sort_keys=True)
    return f"latency-{hashlib.sha256(identity.encode()).hexdigest()[:20]}.json"


def processor_name() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux), else what :func:`platform.processor` says."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _runtime_version(runtime: str) -> str | None:
    if runtime == "pytorch":
        return None  # torch's version is in the key already
    try:
        return metadata.version("onnxruntime")
    except metadata.PackageNotFoundError:
        return None


def _read_cache(cache_dir: str | Path | None, key: str) -> CostModel | None:
    if cache_dir is None:
        return None
    path = Path(cache_dir) / key
    try:
        return CostModel(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None  # absent or unreadable: measured again, and rewritten


def _write_cache(cache_dir: str | Path | None, key: str, costs: CostModel) -> None:
    if cache_dir is None:
        return
    directory = Path(cache_dir)
    directory.mkdir(parents=True, exist_ok=True)
    temporary = directory / f".{key}.{os.getpid()}.tmp"
    temporary.write_text(json.dumps(costs.to_dict(), sort_keys=True))
    temporary.replace(directory / key)  # atomic: a concurrent reader sees the old file or the new
