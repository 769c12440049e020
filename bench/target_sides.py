"""Side by side at one speed target: heads only, heads + neurons with CAHP's heads, and with salience's.

On a fine-tuned dense model (``--dense DIR``) and its dataset, for one target (default x2.0 on PyTorch fp32,
batch 32 x 64 tokens, 1 thread) and each seed, with no fine-tuning after pruning (retraining-free):

- ``heads_only``: the allocation may remove heads only (every neuron kept), CAHP choosing which heads
  within its per-layer counts. Where the latency table says removing heads cannot reach the target, the
  cell says so (``reachable: false`` and the most heads alone reach), and ``heads_only_fastest`` (one
  head per layer, CAHP's choice) is measured instead: the fastest model heads alone give.
- ``cahp``: heads and neurons, the run's own path (:func:`cahp_engine.allocation.prune_to_target` with
  its corrections), CAHP choosing which heads fill each layer's count.
- ``salience``: the very allocation of ``cahp`` (the same heads per layer, the same neurons), the heads
  chosen by salience top-k instead.

Each cell records the heads and neurons kept per layer, the predicted and measured speed-up (dense
against pruned, alternating rounds at the target's shape and runtime, :func:`time_pair`), the FLOPs kept,
and the test accuracy and macro-F1 as cut and after layer-wise reconstruction (the run's
``recovery reconstruct``: attention and, where neurons were removed, feed-forward output projections
refit on the seed's calibration rows). The seed draws the calibration rows (importance, reconstruction)
and seeds CAHP's analysis. Cells are saved as they finish; a rerun with the same arguments skips those
already in the results file.

Run (the lead's SST-5 3-epoch model):
``OMP_NUM_THREADS=1 nice -n 10 python -m bench target_sides --dense studies/results/cache/quality_sst5/dense
--data /work/shared/data/sst5 --seeds 42,43,44``
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.common import RESULTS, SST5, dense_task, pin_threads, recorded, save
from cahp_engine.allocation import flops_costs, latency_costs, prune_to_target, time_pair, unit_importance
from cahp_engine.config import PruningConfig
from cahp_engine.models import prune_heads, prune_neurons
from cahp_engine.recovery import evaluate, reconstruct
from cahp_engine.run._reconstruct import calibration_batches, reconstruct_pruned, reconstruction_options
from cahp_engine.run._target_record import ENGINE_RUNTIMES
from cahp_engine.run._target_stage import heads_within
from cahp_engine.selection import select_heads

ARMS = ("heads_only", "cahp", "salience")
#: A neuron score no head reaches: the allocation then removes heads only.
KEEP = 1e30


def _settings(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def _scores(model: torch.nn.Module, test: Any) -> dict[str, float]:
    metrics = evaluate(model, test)
    return {"accuracy": metrics.accuracy, "macro_f1": metrics.macro_f1}


def _cell(dense: torch.nn.Module, pruned: torch.nn.Module, *, context: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """Measure ``pruned`` (speed, accuracy as cut and reconstructed) into a cell with ``fields``."""
    args, costs, flops = context["args"], context["costs"], context["flops"]
    heads = np.asarray(fields["heads_per_layer"])
    neurons = np.asarray(fields["neurons_per_layer"])
    if "measured_speedup" not in fields:
        dense_s, pruned_s = time_pair(dense, pruned, batch_size=args.batch, seq_len=args.seq_len,
                                      runtime=context["runtime"], repeats=args.repeats)
        fields["measured_speedup"] = dense_s / pruned_s
    fields.setdefault("predicted_speedup", costs.dense / costs.predict(heads, neurons))
    fields["flops_kept"] = flops.predict(heads, neurons) / flops.dense
    fields["as_cut"] = _scores(pruned, context["test"])
    refit = copy.deepcopy(pruned)
    rebuilt = reconstruct_pruned(dense, refit, context["batches"], context["config"])
    fields["reconstructed"] = _scores(refit, context["test"])
    fields["reconstruction"] = rebuilt.describe()
    if context["args"].ffn_block and rebuilt.ffn_target is not None:
        # The same cut refit with the feed-forward block's own output as the target instead of its sum with
        # the residual: what the run did before it matched the sum.
        block = copy.deepcopy(pruned)
        options = dataclasses.replace(reconstruction_options(block, context["config"]), ffn_target="block")
        rebuilt = reconstruct(dense, block, context["batches"], options, seed=context["config"].seed)
        fields["reconstructed_ffn_block"] = _scores(block, context["test"])
        fields["reconstruction_ffn_block"] = rebuilt.describe()
    return fields


def _seed_cells(dense: torch.nn.Module, data: dict[str, Any], seed: int, args: argparse.Namespace,
                done: dict[str, Any], write: Any) -> None:
    """Every arm of one seed not in ``done`` (each written as it finishes)."""
    config = PruningConfig(**{**data["settings"], "seed": seed})
    batches = calibration_batches(data["train"], config)
    runtime = ENGINE_RUNTIMES[args.runtime]
    cache = Path(args.out).parent / "cache" / "latency"
    costs = latency_costs(dense, batch_size=args.batch, seq_len=args.seq_len, runtime=runtime,  # type: ignore[arg-type]
                          repeats=args.repeats, cache_dir=cache)
    context = {"args": args, "costs": costs, "flops": flops_costs(dense, batch_size=args.batch, seq_len=args.seq_len),
               "test": data["test"], "batches": batches, "config": config, "runtime": runtime}
    scores = unit_importance(dense, batches)
    analysis = select_heads(dense, data["train"], config).analysis
    layers = costs.num_layers

    def chooser(strategy: str) -> Any:
        return lambda counts: heads_within(analysis, strategy, counts, seed=seed)

    key = f"seed {seed}"
    if f"{key}/heads_only" not in done:
        # Heads alone: the neurons' cost moved into the fixed part, so the table says what heads can reach.
        heads_costs = dataclasses.replace(costs, fixed=costs.fixed + layers * costs.num_neurons * costs.neuron,
                                          neuron=0.0)
        most = heads_costs.dense / heads_costs.floor
        if args.target > most:
            fastest = copy.deepcopy(dense).eval()
            kept = chooser("cahp")([1] * layers)
            prune_heads(fastest, dict(enumerate(kept)))
            write(f"{key}/heads_only", {"reachable": False, "reachable_speedup": most,
                                        "note": f"heads alone reach at most x{most:.2f} by the latency table"})
            write(f"{key}/heads_only_fastest", _cell(dense, fastest, context=context, heads_per_layer=[1] * layers,
                                                     neurons_per_layer=[costs.num_neurons] * layers))
        else:
            only = dataclasses.replace(scores, neurons=torch.full_like(scores.neurons, KEEP))
            pruned, result = prune_to_target(dense, batches, target_speedup=args.target, batch_size=args.batch,
                                             seq_len=args.seq_len, runtime=runtime, importance=only,
                                             choose_heads=chooser("cahp"), cache_dir=cache, repeats=args.repeats,
                                             corrections=args.corrections)
            write(f"{key}/heads_only", _cell(
                dense, pruned, context=context, reachable=True, reachable_speedup=most,
                heads_per_layer=list(result.heads_per_layer), neurons_per_layer=list(result.neurons_per_layer),
                predicted_speedup=result.allocation.predicted_speedup, measured_speedup=result.measured_speedup,
                corrections=result.corrections,
                # A correction aiming past what heads reach would take neurons too: said, not hidden.
                neurons_removed=layers * costs.num_neurons - sum(result.neurons_per_layer)))
    if f"{key}/cahp" not in done:
        pruned, result = prune_to_target(dense, batches, target_speedup=args.target, batch_size=args.batch,
                                         seq_len=args.seq_len, runtime=runtime, importance=scores,
                                         choose_heads=chooser("cahp"), cache_dir=cache, repeats=args.repeats,
                                             corrections=args.corrections)
        write(f"{key}/cahp", _cell(
            dense, pruned, context=context, heads_per_layer=list(result.heads_per_layer),
            neurons_per_layer=list(result.neurons_per_layer), predicted_speedup=result.allocation.predicted_speedup,
            measured_speedup=result.measured_speedup, corrections=result.corrections,
            kept_neurons=[list(n) for n in result.allocation.kept_neurons]))
    if f"{key}/salience" not in done:
        plan = done[f"{key}/cahp"]
        pruned = copy.deepcopy(dense).eval()
        prune_heads(pruned, dict(enumerate(chooser("salience")(plan["heads_per_layer"]))))
        prune_neurons(pruned, dict(enumerate(plan["kept_neurons"])))
        write(f"{key}/salience", _cell(dense, pruned, context=context, heads_per_layer=plan["heads_per_layer"],
                                       neurons_per_layer=plan["neurons_per_layer"],
                                       note="the allocation of the cahp cell, salience top-k heads in each layer"))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench target_sides")
    p.add_argument("--dense", required=True, help="a dense model fine-tuned on the dataset")
    p.add_argument("--data", default=str(SST5), help="the dataset directory (train and test splits)")
    p.add_argument("--target", type=float, default=2.0, help="target_speedup")
    p.add_argument("--runtime", default="pytorch", choices=sorted(ENGINE_RUNTIMES), help="target_runtime")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5, help="timed passes per measurement (median)")
    p.add_argument("--corrections", type=int, default=2, help="the run's: allocations aimed again after a miss")
    p.add_argument("--seeds", default="42")
    p.add_argument("--ffn-block", action="store_true",
                   help="also refit each cut with the feed-forward block target (reconstructed_ffn_block)")
    p.add_argument("--setting", action="append", default=[], metavar="KEY=VALUE",
                   help="a PruningConfig setting for the analysis and calibration (e.g. resolution=6)")
    p.add_argument("--out", default=str(RESULTS / "target_sides.json"))
    args = p.parse_args(argv)
    pin_threads(args.threads)
    seeds = [int(s) for s in args.seeds.split(",")]
    settings = _settings(args.setting)
    out = Path(args.out)
    identity = {"dense": str(Path(args.dense).resolve()), "data": str(Path(args.data).resolve()),
                "target_speedup": args.target, "runtime": args.runtime, "batch": args.batch,
                "seq_len": args.seq_len, "threads": args.threads, "corrections": args.corrections,
                "settings": settings, "ffn_block": args.ffn_block}
    cells: dict[str, Any] = recorded(out, identity).get("cells", {})
    if cells:
        print(f"resuming: {len(cells)} cell(s) already in {out}", flush=True)

    dense, train, test = dense_task(args.dense, args.data, PruningConfig(**settings).max_length)
    data = {"settings": settings, "train": train, "test": test}
    command = "OMP_NUM_THREADS=1 nice -n 10 python -m bench target_sides " + " ".join(argv or [])
    protocol = (f"target x{args.target:g} on {args.runtime}, batch {args.batch} x {args.seq_len} tokens, "
                f"{args.threads} thread(s); no fine-tuning after pruning; accuracy on the test split as cut and "
                "after layer-wise reconstruction on the seed's calibration rows; measured = dense / pruned median "
                f"of {args.repeats} passes in 3 alternating rounds")

    def write(name: str, cell: dict[str, Any]) -> None:
        cells[name] = cell
        shown = {k: v for k, v in cell.items() if k != "kept_neurons"}
        print(f"{name}: {json.dumps(shown)}", flush=True)
        save(out.name, {"identity": identity, "dense_accuracy": dense_scores, "cells": cells}, command=command,
             protocol=protocol, results=out.parent)

    dense_scores = _scores(dense, data["test"])
    print(f"dense: {dense_scores}", flush=True)
    started = time.perf_counter()
    for seed in seeds:
        if all(f"seed {seed}/{arm}" in cells for arm in ARMS):
            continue
        _seed_cells(dense, data, seed, args, cells, write)
    print(f"done in {time.perf_counter() - started:.0f} s; saved {out}")


if __name__ == "__main__":
    main()
