"""What the consensus strategies add to a selection's wall time.

A consensus combines the analyses a selection already has (the full one and its K leave-one-shard-out
ones): no sample is read again, no t-SNE is rerun. This measures its cost against the selection it
adds to, on random BERT-shaped models (``--shapes``, default 6x12, the shape of all-MiniLM-L6-v2, and
12x12, BERT-base's) over synthetic SST-5-shaped samples, and on ``--heads`` heads (default 384, 24x16)
from the cheap stages alone (random signature statistics: the forward passes, which only make the
selection longer, are left out, so that ratio is against the cheap stages, an upper bound).

Run: ``python -m bench consensus-cost [--threads 1] [--samples 1000] [--repeats 3] [--shapes 6x12,12x12]
[--heads 384]``; figures in ``bench/results/consensus_cost.json``. About 7 minutes at one thread.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from typing import Any

import numpy as np

from bench.common import pin_threads, save
from bench.stages import NUM_CLASSES, bert_shaped, synthetic_data
from cahp_engine.config import CONSENSUS_STRATEGIES, PruningConfig
from cahp_engine.selection import (
    HeadAnalysis,
    Signatures,
    choose,
    head_structure,
    select_heads,
)

#: Each choice is timed this many times (they take milliseconds) and the median kept.
CHOICE_REPEATS = 15


def _choice_seconds(analysis: HeadAnalysis, k: int, strategy: str) -> float:
    times = []
    for _ in range(CHOICE_REPEATS):
        start = time.perf_counter()
        choose(analysis, k, strategy, seed=0)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _consensus_costs(analysis: HeadAnalysis, k: int, selection_s: float) -> dict[str, Any]:
    """Per method: its choice's time, what it adds over CAHP's own choice, and that as a share of ``selection_s``."""
    single = _choice_seconds(analysis, k, "cahp")
    out: dict[str, Any] = {"cahp_choice_s": single}
    for method in CONSENSUS_STRATEGIES:
        seconds = _choice_seconds(analysis, k, method)
        out[method] = {"choice_s": seconds, "added_s": seconds - single,
                       "share_of_selection": (seconds - single) / selection_s}
    return out


def model_shape(layers: int, heads: int, *, samples: int, repeats: int, seed: int) -> dict[str, Any]:
    """``select_heads`` with the defaults (CAHP, stopping rules, 5 stability shards), then each consensus."""
    model = bert_shaped(layers, heads, 32, seed)
    data = synthetic_data(samples, vocab=8000, seed=seed)
    config = PruningConfig(resolution=32, seed=seed)
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = select_heads(model, data, config)
        runs.append(time.perf_counter() - start)
    assert result.analysis is not None
    selection_s = statistics.median(runs)
    return {"shape": f"{layers}x{heads}", "heads": layers * heads, "samples": samples,
            "signature_rows": result.analysis.signature_samples,
            "calibration_rows": result.analysis.calibration_samples,
            "k_star": result.k_star, "selection_s": selection_s, "selection_runs_s": runs,
            "timings_s": result.timings, "consensus": _consensus_costs(result.analysis, result.k_star, selection_s)}


def heads_only(n_heads: int, *, seed: int, shards: int = 5) -> dict[str, Any]:
    """The cheap stages on random statistics of ``n_heads`` heads, once in full and once per left-out shard."""
    rng = np.random.default_rng(seed)
    pixels = 16 * 16
    base = rng.normal(size=(NUM_CLASSES, n_heads, pixels)) * rng.uniform(0.0, 0.5, size=(1, n_heads, 1))
    layers, heads = 24, n_heads // 24

    def structure(noise: float) -> tuple[Any, float]:
        signatures = Signatures(mean=base + noise * rng.normal(size=base.shape), var=np.ones_like(base),
                                counts=np.full(NUM_CLASSES, 200), resolution=16, num_layers=layers,
                                num_heads=heads)
        start = time.perf_counter()
        found = head_structure(signatures, var_floor=1e-6, perplexity=None, seed=seed, degrees=(2,))
        return found, time.perf_counter() - start

    raw = rng.random((layers, heads))
    salience = (raw - raw.min()) / (raw.max() - raw.min())

    def analysis(found: Any) -> HeadAnalysis:
        return HeadAnalysis(curve=found.curve, knees=found.knees, graph_space=found.graph_space,
                            salience_raw=salience, salience=salience, resolution=16, signature_samples=1000,
                            calibration_samples=250)

    main, main_s = structure(0.0)
    others = [structure(0.05) for _ in range(shards)]
    full = dataclasses.replace(analysis(main), leave_one_out=tuple(analysis(found) for found, _ in others))
    cheap_s = main_s + sum(s for _, s in others)
    k = main.knees[2].k
    return {"heads": n_heads, "k_star": k, "cheap_stages_s": cheap_s, "cheap_stages_main_s": main_s,
            "consensus": _consensus_costs(full, k, cheap_s)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench consensus-cost")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--samples", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--shapes", default="6x12,12x12", help="comma-separated LAYERSxHEADS")
    p.add_argument("--heads", type=int, default=384, help="heads of the cheap-stages-only case (0: skip it)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    pin_threads(args.threads)
    shapes = [tuple(int(v) for v in shape.split("x")) for shape in args.shapes.split(",") if shape]
    payload: dict[str, Any] = {"models": [], "heads_only": None}
    for layers, heads in shapes:
        row = model_shape(layers, heads, samples=args.samples, repeats=args.repeats, seed=args.seed)
        payload["models"].append(row)
        costs = row["consensus"]
        print(f"{row['shape']}: selection {row['selection_s']:.1f} s; " + ", ".join(
            f"{m} +{1000 * costs[m]['added_s']:.1f} ms ({100 * costs[m]['share_of_selection']:.3f} %)"
            for m in CONSENSUS_STRATEGIES), flush=True)
    if args.heads:
        row = heads_only(args.heads, seed=args.seed)
        payload["heads_only"] = row
        print(f"{args.heads} heads: cheap stages x6 {row['cheap_stages_s']:.1f} s; " + ", ".join(
            f"{m} +{1000 * row['consensus'][m]['added_s']:.1f} ms" for m in CONSENSUS_STRATEGIES), flush=True)
    command = "python -m bench consensus-cost " + " ".join(argv or [])
    path = save("consensus_cost.json", payload, command=command.strip(), protocol=(
        f"select_heads with the defaults (CAHP, stopping rules, 5 stability shards, B=32) on random BERT-shaped "
        f"models (hidden 32 x heads) over {args.samples} synthetic SST-5-shaped samples with random labels, median "
        f"of {args.repeats} runs; each choice at k* timed {CHOICE_REPEATS} times (median); 'added' is a consensus "
        f"choice's time less CAHP's own choice; {args.threads} torch thread(s). heads_only: the cheap stages "
        "(separation, t-SNE, sweep, knee) on random statistics, once in full and once per each of 5 perturbed "
        "left-out analyses, and the consensus against those stages alone"))
    print(f"saved {path}")
