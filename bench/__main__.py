"""``python -m bench <name> [options]``: run one benchmark and save its figures under bench/results/.

Benchmarks are repeatable measurements (time, memory, speed, load), never pass/fail; the research
experiments (the quality grids and the studies run on them) are ``python -m studies``.
"""

from __future__ import annotations

import importlib
import os
import sys

BENCHMARKS = {
    "stages": "bench.stages",
    "sst5-selection": "bench.sst5_selection",
    "selection-sampling": "bench.selection_sampling",
    "speed": "bench.speed",
    "onnx-speed": "bench.onnx_speed",
    "load": "bench.load",
    "gpu-check": "bench.gpu_check",
}


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in BENCHMARKS:
        print("usage: python -m bench {" + "|".join(BENCHMARKS) + "} [options]\n"
              "(research experiments: python -m studies)", file=sys.stderr)
        sys.exit(2)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    importlib.import_module(BENCHMARKS[sys.argv[1]]).main(sys.argv[2:])


if __name__ == "__main__":
    main()
