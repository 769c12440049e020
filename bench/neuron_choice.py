"""Which feed-forward neurons fill each layer's count: importance top-k against complementarity choices.

On a fine-tuned dense model (``--dense DIR``) and its dataset, for each seed, the product's allocation is
fixed once: Fisher importance of every head and neuron on the seed's calibration rows
(:func:`cahp_engine.allocation.unit_importance`), the heads and neurons each layer keeps at a FLOPs target
(default ``target_flops`` 0.47, what the x2.0 latency target kept on SST-5, without timing noise) or a
speed target (``--target-speedup``, the latency table only: no timed corrections), and CAHP's heads within
those counts (:func:`cahp_engine.run._target_stage.heads_within`). Only the choice of *which* neurons fill
each layer's count changes between the variants:

- ``importance``: the layer's most important neurons (the allocation's own choice, today's product);
- ``cluster``: CAHP's rule applied to neurons. Each neuron is described by its activation profile (its
  post-activation values on ``--tokens`` real tokens of the calibration rows, drawn with the seed, in the
  dense model); the layer's neurons are clustered into exactly its kept count by k-medoids (FasterPAM) on
  the distance ``1 - |corr|`` (two neurons whose activations are affine in each other are redundant for a
  linear refit), and each cluster keeps its most important neuron;
- ``greedy``: importance with a redundancy penalty: neurons are taken one by one, each time the one with
  the largest ``importance * (1 - max |corr| with those taken)``;
- ``random``: the count drawn uniformly (an anchor: how much the choice matters at all).

Each cell records the test accuracy and macro-F1 as cut and after layer-wise reconstruction (the run's
``recovery reconstruct``: attention and feed-forward output projections refit by ridge least squares on
the calibration rows), the mean relative error of the feed-forward refits, per layer what the kept neurons
are (their share of the layer's importance, how often they are active, how redundant among themselves),
and the seconds each step
cost: the shared ones per seed (importance, allocation, profiles and their correlations) and, per
variant, the choice and the reconstruction. Cells are saved as they finish; a rerun with the same
arguments skips those already in the results file.

Run (the quality study's SST-5 model):
``OMP_NUM_THREADS=1 nice -n 10 python -m bench neuron_choice --dense studies/results/cache/quality_sst5/dense
--data /work/shared/data/sst5 --seeds 42,43,44``
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import kmedoids
import numpy as np
import torch
from torch import nn

from bench.common import RESULTS, SST5, dense_task, pin_threads, recorded, save
from cahp_engine.allocation import allocate, flops_costs, latency_costs, unit_importance
from cahp_engine.config import PruningConfig
from cahp_engine.models import get_adapter, prune_heads, prune_neurons
from cahp_engine.recovery import evaluate
from cahp_engine.run._reconstruct import calibration_batches, reconstruct_pruned
from cahp_engine.run._target_record import ENGINE_RUNTIMES
from cahp_engine.run._target_stage import heads_within
from cahp_engine.selection import select_heads

VARIANTS = ("importance", "cluster", "greedy", "random")


def ffn_profiles(model: nn.Module, batches: Sequence[dict[str, torch.Tensor]], *, tokens: int,
                 seed: int) -> list[np.ndarray]:
    """Each layer's feed-forward activations (what enters its output projection) on ``tokens`` real tokens.

    Returns
    -------
    list of L arrays of shape (T, I), float32; T = min(tokens, real tokens in ``batches``), the same tokens
    for every layer, drawn with ``seed``.
    """
    masks = [b["attention_mask"].bool() for b in batches]
    total = int(sum(int(m.sum()) for m in masks))
    picked = np.sort(np.random.default_rng(seed).choice(total, size=min(tokens, total), replace=False))
    adapter = get_adapter(model)
    outputs = [adapter.feed_forward(layer).output for layer in adapter.layers(model)]
    taken: list[list[torch.Tensor]] = [[] for _ in outputs]
    state: dict[str, Any] = {}

    def keep(index: int) -> Any:
        def hook(_module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            rows = args[0][state["mask"]]  # (real tokens of the batch, I), in the flattened order
            taken[index].append(rows[state["local"]].detach().float().cpu())
        return hook

    handles = [out.register_forward_pre_hook(keep(i)) for i, out in enumerate(outputs)]
    try:
        offset = 0
        with torch.no_grad():
            for batch, mask in zip(batches, masks, strict=True):
                count = int(mask.sum())
                local = picked[(picked >= offset) & (picked < offset + count)] - offset
                offset += count
                if local.size == 0:
                    continue
                state["mask"], state["local"] = mask, torch.as_tensor(local)
                model(**{k: v for k, v in batch.items() if k != "labels"})
    finally:
        for handle in handles:
            handle.remove()
    return [torch.cat(rows).numpy() for rows in taken]


def abs_correlation(profile: np.ndarray) -> np.ndarray:
    """``|corr|`` between the columns of ``profile`` (T, I): (I, I) float64; a constant neuron correlates with
    none (0) but itself (1)."""
    centred = profile.astype(np.float64) - profile.mean(axis=0, dtype=np.float64)
    norms = np.linalg.norm(centred, axis=0)
    centred /= np.where(norms > 0, norms, 1.0)
    corr = np.abs(centred.T @ centred)
    np.fill_diagonal(corr, 1.0)
    return np.clip(corr, 0.0, 1.0)


def cluster_choice(corr: np.ndarray, importance: np.ndarray, k: int, *, seed: int) -> list[int]:
    """CAHP's rule on neurons: ``k`` k-medoids clusters on ``1 - |corr|``, each cluster's most important one."""
    n = importance.size
    if k >= n:
        return list(range(n))
    if k <= 0:
        return []
    result = kmedoids.fasterpam(1.0 - corr, medoids=k, random_state=seed, n_cpu=1)
    labels = np.asarray(result.labels).copy()
    medoids = np.asarray(result.medoids)
    labels[medoids] = np.arange(k)  # a tie at distance 0 never empties a medoid's own cluster
    return sorted(int(np.flatnonzero(labels == c)[np.argmax(importance[labels == c])]) for c in range(k))


def greedy_choice(corr: np.ndarray, importance: np.ndarray, k: int) -> list[int]:
    """``k`` neurons taken one by one, each maximising ``importance * (1 - max |corr| with those taken)``."""
    n = importance.size
    if k >= n:
        return list(range(n))
    chosen: list[int] = []
    overlap = np.zeros(n)
    free = np.ones(n, dtype=bool)
    for _ in range(max(k, 0)):
        gain = np.where(free, importance * (1.0 - overlap), -np.inf)
        best = int(np.argmax(gain))
        chosen.append(best)
        free[best] = False
        overlap = np.maximum(overlap, corr[best])
    return sorted(chosen)


def _scores(model: nn.Module, test: Any) -> dict[str, float]:
    metrics = evaluate(model, test)
    return {"accuracy": metrics.accuracy, "macro_f1": metrics.macro_f1}


def _plan(dense: nn.Module, data: dict[str, Any], seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """The seed's fixed allocation (heads and neuron counts), the importance, and the neurons' profiles."""
    config = PruningConfig(**{**data["settings"], "seed": seed})
    batches = calibration_batches(data["train"], config)
    started = time.perf_counter()
    scores = unit_importance(dense, batches)
    seconds = {"importance": time.perf_counter() - started}
    started = time.perf_counter()
    if args.target_speedup is not None:
        costs = latency_costs(dense, batch_size=args.batch, seq_len=args.seq_len,
                              runtime=ENGINE_RUNTIMES[args.runtime],  # type: ignore[arg-type]
                              repeats=args.repeats, cache_dir=Path(args.out).parent / "cache" / "latency")
        plan = allocate(scores, costs, target_speedup=args.target_speedup)
    else:
        plan = allocate(scores, flops_costs(dense, batch_size=args.batch, seq_len=args.seq_len),
                        target_flops=args.target_flops)
    seconds["allocation"] = time.perf_counter() - started
    started = time.perf_counter()
    analysis = select_heads(dense, data["train"], config).analysis
    heads = heads_within(analysis, "cahp", list(plan.heads_per_layer), seed=seed)
    seconds["cahp_heads"] = time.perf_counter() - started
    started = time.perf_counter()
    profiles = ffn_profiles(dense, batches, tokens=args.tokens, seed=seed)
    seconds["profiles"] = time.perf_counter() - started
    started = time.perf_counter()
    corr = [abs_correlation(p) for p in profiles]
    seconds["correlations"] = time.perf_counter() - started
    flops = flops_costs(dense, batch_size=args.batch, seq_len=args.seq_len)
    return {"config": config, "batches": batches, "heads": heads, "importance": scores.neurons.numpy(),
            "counts": list(plan.neurons_per_layer), "allocated": [list(n) for n in plan.kept_neurons],
            "corr": corr, "active": [(p > 0).mean(axis=0) for p in profiles], "tokens": int(profiles[0].shape[0]),
            "seconds": seconds,
            "flops_kept": flops.predict(np.array(plan.heads_per_layer), np.array(plan.neurons_per_layer)) / flops.dense,
            "predicted_speedup": plan.predicted_speedup}


def choose_neurons(variant: str, plan: dict[str, Any], seed: int) -> list[list[int]]:
    """The neurons each layer keeps under ``variant``, ``plan["counts"][l]`` of layer ``l``."""
    rng = np.random.default_rng(seed)
    kept = []
    for layer, k in enumerate(plan["counts"]):
        importance = plan["importance"][layer]
        if variant == "importance":
            kept.append(plan["allocated"][layer])
        elif variant == "cluster":
            kept.append(cluster_choice(plan["corr"][layer], importance, k, seed=seed))
        elif variant == "greedy":
            kept.append(greedy_choice(plan["corr"][layer], importance, k))
        else:
            kept.append(sorted(int(i) for i in rng.choice(importance.size, size=k, replace=False)))
    return kept


def _traits(plan: dict[str, Any], kept: list[list[int]]) -> dict[str, list[float | None]]:
    """Per layer, what the kept neurons are: their share of the layer's importance, the median share of
    profile tokens on which one is active (> 0), and the median of each one's largest ``|corr|`` with another
    kept neuron (their redundancy; None with fewer than two)."""
    share: list[float | None] = []
    active: list[float | None] = []
    redundancy: list[float | None] = []
    for layer, neurons in enumerate(kept):
        importance, corr = plan["importance"][layer], plan["corr"][layer]
        share.append(round(float(importance[neurons].sum() / max(importance.sum(), 1e-300)), 4))
        active.append(round(float(np.median(plan["active"][layer][neurons])), 4) if neurons else None)
        among = corr[np.ix_(neurons, neurons)] - np.eye(len(neurons))
        redundancy.append(round(float(np.median(among.max(axis=1))), 4) if len(neurons) > 1 else None)
    return {"importance_kept": share, "active_kept": active, "redundancy_kept": redundancy}


def _cell(dense: nn.Module, plan: dict[str, Any], variant: str, seed: int, test: Any) -> dict[str, Any]:
    started = time.perf_counter()
    kept = choose_neurons(variant, plan, seed)
    choice_s = time.perf_counter() - started
    if [len(k) for k in kept] != plan["counts"]:
        raise RuntimeError(f"{variant} kept {[len(k) for k in kept]} neurons, the allocation {plan['counts']}")
    pruned = copy.deepcopy(dense).eval()
    prune_heads(pruned, dict(enumerate(plan["heads"])))
    prune_neurons(pruned, dict(enumerate(kept)))
    as_cut = _scores(pruned, test)
    started = time.perf_counter()
    rebuilt = reconstruct_pruned(dense, pruned, plan["batches"], plan["config"])
    refit_s = time.perf_counter() - started
    ffn = [f.error_after for f in rebuilt.fits if f.sublayer == "ffn"]
    kept_traits = _traits(plan, kept)
    return {"heads_per_layer": [len(h) for h in plan["heads"]], "neurons_per_layer": plan["counts"],
            "flops_kept": plan["flops_kept"], "predicted_speedup": plan["predicted_speedup"],
            "same_as_importance": [len(set(a) & set(b)) for a, b in zip(kept, plan["allocated"], strict=True)],
            "identical_layers": sum(list(k) == list(a) for k, a in zip(kept, plan["allocated"], strict=True)),
            "as_cut": as_cut, "reconstructed": _scores(pruned, test),
            **kept_traits, "ffn_error_after": float(np.mean(ffn)) if ffn else None,
            "reconstruction": rebuilt.describe(),
            "choice_seconds": choice_s, "reconstruction_seconds": refit_s}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench neuron_choice", description=__doc__.splitlines()[0])
    p.add_argument("--dense", required=True, help="a dense model fine-tuned on the dataset")
    p.add_argument("--data", default=str(SST5), help="the dataset directory (train and test splits)")
    targets = p.add_mutually_exclusive_group()
    targets.add_argument("--target-flops", type=float, default=0.47, help="target_flops (default 0.47)")
    targets.add_argument("--target-speedup", type=float, default=None,
                        help="target_speedup instead, by the latency table alone (measured once, then cached)")
    p.add_argument("--runtime", default="pytorch", choices=sorted(ENGINE_RUNTIMES), help="target_runtime")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5, help="timed passes per latency measurement (median)")
    p.add_argument("--tokens", type=int, default=4096, help="calibration tokens in a neuron's profile")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"some of {', '.join(VARIANTS)}")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seeds", default="42")
    p.add_argument("--setting", action="append", default=[], metavar="KEY=VALUE",
                   help="a PruningConfig setting for the analysis and calibration (e.g. resolution=6)")
    p.add_argument("--out", default=str(RESULTS / "neuron_choice.json"))
    args = p.parse_args(argv)
    variants = args.variants.split(",")
    if not variants or any(v not in VARIANTS for v in variants):
        p.error(f"--variants must name some of {', '.join(VARIANTS)}, got {args.variants!r}")
    if args.tokens < 2:
        p.error(f"--tokens must be an integer >= 2, got {args.tokens}")
    if args.target_speedup is not None:
        args.target_flops = None
    pin_threads(args.threads)
    settings: dict[str, Any] = {}
    for pair in args.setting:
        key, _, value = pair.partition("=")
        try:
            settings[key] = json.loads(value)
        except json.JSONDecodeError:
            settings[key] = value
    out = Path(args.out)
    identity = {"dense": str(Path(args.dense).resolve()), "data": str(Path(args.data).resolve()),
                "target_flops": args.target_flops, "target_speedup": args.target_speedup, "runtime": args.runtime,
                "batch": args.batch, "seq_len": args.seq_len, "tokens": args.tokens, "threads": args.threads,
                "settings": settings}
    previous = recorded(out, identity)
    cells: dict[str, Any] = previous.get("cells", {})
    shared: dict[str, Any] = previous.get("shared", {})
    if cells:
        print(f"resuming: {len(cells)} cell(s) already in {out}", flush=True)

    dense, train, test = dense_task(args.dense, args.data, PruningConfig(**settings).max_length)
    data = {"settings": settings, "train": train}
    target = (f"target_speedup x{args.target_speedup:g} on {args.runtime} (latency table, no timed corrections)"
              if args.target_speedup is not None else f"target_flops {args.target_flops:g}")
    command = "OMP_NUM_THREADS=1 nice -n 10 python -m bench neuron_choice " + " ".join(argv or [])
    protocol = (f"allocation fixed per seed ({target}, batch {args.batch} x {args.seq_len} tokens; Fisher importance "
                "and reconstruction on the seed's calibration rows; CAHP's heads within the counts); only the "
                f"neurons each layer keeps vary; profiles on {args.tokens} calibration tokens of the dense model; "
                f"{args.threads} thread(s); no fine-tuning; accuracy on the test split as cut and reconstructed")
    dense_scores = previous.get("dense_accuracy")
    if dense_scores is None:
        dense_scores = _scores(dense, test)
    print(f"dense: {dense_scores}", flush=True)

    def write() -> None:
        save(out.name, {"identity": identity, "dense_accuracy": dense_scores, "shared": shared, "cells": cells},
             command=command, protocol=protocol, results=out.parent)

    started = time.perf_counter()
    for seed in (int(s) for s in args.seeds.split(",")):
        todo = [v for v in variants if f"seed {seed}/{v}" not in cells]
        if not todo:
            continue
        plan = _plan(dense, data, seed, args)
        shared[f"seed {seed}"] = {"seconds": plan["seconds"], "tokens": plan["tokens"],
                                  "neurons_per_layer": plan["counts"]}
        print(f"seed {seed}: {json.dumps(shared[f'seed {seed}'])}", flush=True)
        for variant in todo:
            cell = _cell(dense, plan, variant, seed, test)
            cells[f"seed {seed}/{variant}"] = cell
            print(f"seed {seed}/{variant}: {json.dumps(cell)}", flush=True)
            write()
    print(f"done in {time.perf_counter() - started:.0f} s; saved {out}")


if __name__ == "__main__":
    main()
