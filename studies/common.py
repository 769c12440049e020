"""Where the studies' files go, and the benchmarks' helpers they share (thread pinning, machine facts,
the real encoder, SST-5).

Results: studies/results/<name>. Resume caches: studies/results/cache/<name>/, not tracked by git
(``python -m studies`` says how a study is carried across checkouts).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench import common as _bench
from bench.common import CPU_PATH_PINS, SST5, PeakRss, machine, minilm_path, pin_threads, rss_bytes

__all__ = ["CPU_PATH_PINS", "RESULTS", "SST5", "PeakRss", "machine", "minilm_path", "pin_threads",
           "rss_bytes", "save"]

#: Result files; each study's resume cache is ``RESULTS / "cache" / <name>`` (ignored by git).
RESULTS = Path(__file__).resolve().parent / "results"


def save(name: str, payload: dict[str, Any], *, command: str, protocol: str, results: Path | None = None) -> Path:
    """Write ``<results>/<name>`` (default studies/results/) with the machine, command, date and protocol."""
    return _bench.save(name, payload, command=command, protocol=protocol,
                       results=RESULTS if results is None else results)
