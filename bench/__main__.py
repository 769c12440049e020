"""``python -m bench <name> [options]``: run one benchmark and save its figures under bench/results/.

Benchmarks are repeatable measurements (time, memory, speed, load), never pass/fail; the research
experiments (the quality grids and the studies run on them) are ``python -m studies``.
"""

from __future__ import annotations

from bench.dispatch import run_named

BENCHMARKS = {
    "stages": "bench.stages",
    "sst5-selection": "bench.sst5_selection",
    "selection-sampling": "bench.selection_sampling",
    "consensus-cost": "bench.consensus_cost",
    "speed": "bench.speed",
    "onnx-speed": "bench.onnx_speed",
    "load": "bench.load",
    "gpu-check": "bench.gpu_check",
    "preflight": "bench.preflight",
    "resume": "bench.resume",
    "hostile-content": "bench.hostile_content",
    "int8-batch": "bench.int8_batch",
    "eta": "bench.eta",
    "ffn_speed": "bench.ffn_speed",
    "target_cost": "bench.target_cost",
    "target_sides": "bench.target_sides",
    "reconstruction": "bench.reconstruction",
    "neuron_choice": "bench.neuron_choice",
}


def main() -> None:
    run_named(BENCHMARKS, prog="python -m bench", other="research experiments: python -m studies")


if __name__ == "__main__":
    main()
