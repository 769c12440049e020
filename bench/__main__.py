"""``python -m bench <name> [options]``: run one benchmark and save its figures under bench/results/."""

from __future__ import annotations

import importlib
import os
import sys

BENCHMARKS = {
    "stages": "bench.stages",
    "sst5-selection": "bench.sst5_selection",
    "speed": "bench.speed",
    "quality": "bench.quality",
    "quality-causes": "bench.quality_causes",
    "distill-study": "bench.distill_study",
    "load": "bench.load",
    "onnx-speed": "bench.onnx_speed",
    "convergence-study": "bench.convergence_study",
    "selection-sampling": "bench.selection_sampling",
    "mnli-synth": "bench.mnli_synth",
    "gpu-check": "bench.gpu_check",
}


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in BENCHMARKS:
        print("usage: python -m bench {" + "|".join(BENCHMARKS) + "} [options]", file=sys.stderr)
        sys.exit(2)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    importlib.import_module(BENCHMARKS[sys.argv[1]]).main(sys.argv[2:])


if __name__ == "__main__":
    main()
