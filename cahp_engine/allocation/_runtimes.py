"""The serving runtimes a latency is measured on: PyTorch fp32, onnxruntime fp32 and onnxruntime int8.

:func:`runner` turns a model and a batch into a callable that runs one forward pass on the runtime named,
exporting (and quantizing) the model into a temporary directory for onnxruntime, exactly as a deployment
would (:func:`cahp_engine.export.export_onnx`, :func:`cahp_engine.export.quantize_int8`).
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Literal, get_args

import numpy as np
import torch
from torch import nn

from cahp_engine.errors import InvalidInputError

Runtime = Literal["pytorch", "onnxruntime", "onnxruntime-int8"]
RUNTIMES: tuple[str, ...] = get_args(Runtime)


def check_runtime(runtime: object) -> None:
    """Raise :class:`InvalidInputError` unless ``runtime`` is one of :data:`RUNTIMES`."""
    if runtime not in RUNTIMES:
        raise InvalidInputError(f"`runtime` must be one of {', '.join(RUNTIMES)}, got {runtime!r}")


@contextlib.contextmanager
def runner(model: nn.Module, batch: Mapping[str, torch.Tensor], runtime: Runtime) -> Iterator[Callable[[], object]]:
    """A callable running one forward pass of ``model`` on ``batch`` with ``runtime``, while the context is open.

    Parameters
    ----------
    model : a supported sequence classifier, pruned or not (left unchanged)
    batch : ``input_ids`` and ``attention_mask`` of shape (B, T), optionally ``token_type_ids``
    runtime : {"pytorch", "onnxruntime", "onnxruntime-int8"}
        PyTorch fp32 under ``no_grad``; or the model exported to ONNX (fp32, or dynamically quantized to
        int8) run by an onnxruntime session with as many threads as torch uses.
    """
    check_runtime(runtime)
    if runtime == "pytorch":
        def run_torch() -> object:
            with torch.no_grad():
                return model(**batch)

        yield run_torch
        return
    from cahp_engine.export import export_onnx, onnx_session, quantize_int8, run_logits

    with tempfile.TemporaryDirectory(prefix="cahp-latency-") as work:
        path = Path(work) / "onnx"
        export_onnx(model, None, path, check=False)
        if runtime == "onnxruntime-int8":
            quantize_int8(path, Path(work) / "int8")
            path = Path(work) / "int8"
        session = onnx_session(path)
        feed = {name: value.detach().cpu().numpy() for name, value in batch.items()}
        yield lambda: run_logits(session, feed)


def median_seconds(run: Callable[[], object], *, repeats: int, warmup: int = 1,
                   clock: Callable[[], float] = time.perf_counter) -> float:
    """Median wall time of ``repeats`` calls of ``run`` after ``warmup`` untimed calls (allocator, kernels, the
    session's first run)."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeats):
        start = clock()
        run()
        times.append(clock() - start)
    return float(np.median(times))
