"""Pruning heads and feed-forward neurons to a speed target: the speed-up asked, predicted and measured.

For each target, :func:`cahp_engine.allocation.prune_to_target` scores every head and neuron (Fisher, on
SST-5 training sentences), reads the latency table of this machine (fitted once and cached under
bench/results/cache/latency/), allocates the units each layer keeps and cuts them. The pruned model
and the dense one are then timed again, independently, with :func:`cahp_engine.recovery.compare_speed`
(alternating passes, p50), at the serving shape: batch 32, 64 tokens, PyTorch fp32.

Beside the targets, the fastest heads-only model (one head per layer, every neuron kept) is timed the
same way: the most that removing heads alone can give.

Accuracy: with ``--model DIR`` (a dense model fine-tuned on SST-5, e.g. from /work/wt/DENSE_MODELS.md)
the SST-5 test accuracy of the dense model, of each pruned one, and of each after layer-wise
reconstruction of its heads and neurons (retraining-free) is measured too. Without it the encoder is the
pretrained all-MiniLM-L6-v2 with a fresh head: the speed figures hold (speed does not depend on the
weights), the allocation's choice of units does not mean anything and no accuracy is reported.

Run: ``nice -n 10 python -m bench ffn_speed [--threads 1] [--targets 2,3] [--repeats 20] [--runs 3]
[--model DIR] [--data DIR]``
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from typing import Any

import numpy as np
import torch

from bench.common import RESULTS, SST5, minilm_path, pin_threads, save, task_options
from cahp_engine.allocation import flops_costs, latency_costs, prune_to_target, unit_importance
from cahp_engine.data import collate, draw_subset, encode, length_grouped_batches, load_splits
from cahp_engine.models import load_classifier, prune_heads
from cahp_engine.recovery import ReconstructionOptions, compare_speed, evaluate

BATCH, SEQ_LEN = 32, 64


def _speed(dense: torch.nn.Module, pruned: torch.nn.Module, *, repeats: int, runs: int) -> dict[str, Any]:
    """Median over ``runs`` of compare_speed's p50 speed-up at batch 32 x 64 tokens."""
    ratios, dense_ms, pruned_ms = [], [], []
    for run in range(runs):
        row = compare_speed(dense, pruned, batch_sizes=(BATCH,), seq_len=SEQ_LEN, warmup=3, repeats=repeats,
                            seed=run).results[0].to_dict()
        ratios.append(row["speedup"])
        dense_ms.append(row["dense"]["p50_ms"])
        pruned_ms.append(row["pruned"]["p50_ms"])
    return {"measured_speedup": statistics.median(ratios), "runs": ratios,
            "dense_p50_ms": statistics.median(dense_ms), "pruned_p50_ms": statistics.median(pruned_ms)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench ffn_speed")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--targets", default="2,3")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--calibration", type=int, default=512, help="training rows scored")
    p.add_argument("--model", default=None,
                   help="a dense model fine-tuned on --data's task (accuracy is then measured)")
    p.add_argument("--data", default=str(SST5),
                   help="SST-5's directory (default: ../shared/data/sst5 of the repo) or MNLI's (sentence pairs, "
                        "scored on validation_matched)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--out", default=None, help="the results file (default ffn_speed_accuracy.json with --model, "
                   "else ffn_speed.json)")
    args = p.parse_args(argv)
    pin_threads(args.threads)
    targets = [float(t) for t in args.targets.split(",")]
    splits = load_splits(args.data, task_options(args.data))
    loaded = load_classifier(args.model or minilm_path(), num_labels=len(splits.label_names))
    model = loaded.model.eval()
    train = encode(loaded.tokenizer, splits.train, max_length=SEQ_LEN)
    chosen = draw_subset(len(train), min(1.0, args.calibration / len(train)), seed=args.seed, labels=train.labels)
    batches = [collate(train, b) for b in length_grouped_batches(train.lengths, chosen, BATCH)]
    test = encode(loaded.tokenizer, splits.eval, max_length=512) if args.model else None

    start = time.perf_counter()
    scores = unit_importance(model, batches)
    importance_s = time.perf_counter() - start
    cache = RESULTS / "cache" / "latency"
    start = time.perf_counter()
    costs = latency_costs(model, batch_size=BATCH, seq_len=SEQ_LEN, repeats=3, rounds=3, cache_dir=cache)
    table_s = time.perf_counter() - start
    flops = flops_costs(model, batch_size=BATCH, seq_len=SEQ_LEN)
    dense_accuracy = evaluate(model, test).accuracy if test is not None else None
    print(f"importance {importance_s:.1f} s, latency table {table_s:.1f} s (fit error {costs.fit_error:.3f}); "
          f"reachable x{costs.dense / costs.floor:.2f}", flush=True)

    rows: list[dict[str, Any]] = []
    for target in targets:
        started = time.perf_counter()
        pruned, result = prune_to_target(model, batches, target_speedup=target, batch_size=BATCH, seq_len=SEQ_LEN,
                                         importance=scores, cache_dir=cache, repeats=3)
        search_s = time.perf_counter() - started
        speed = _speed(model, pruned, repeats=args.repeats, runs=args.runs)
        row: dict[str, Any] = {
            "target_speedup": target, "heads_per_layer": list(result.heads_per_layer),
            "neurons_per_layer": list(result.neurons_per_layer),
            "predicted_speedup": result.allocation.predicted_speedup,
            "measured_in_search": result.measured_speedup, "corrections": result.corrections,
            "flops_fraction": result.flops_pruned / result.flops_dense, **speed, "search_s": search_s,
        }
        if test is not None:
            row["accuracy"] = evaluate(pruned, test).accuracy
            refit = copy.deepcopy(pruned)
            from cahp_engine.recovery import reconstruct

            reconstruct(model, refit, [{k: v for k, v in b.items() if k != "labels"} for b in batches],
                        ReconstructionOptions(sublayers=("attention", "ffn")))
            row["accuracy_reconstructed"] = evaluate(refit, test).accuracy
        rows.append(row)
        print(f"target x{target:g}: predicted x{row['predicted_speedup']:.2f}, measured x{row['measured_speedup']:.2f} "
              f"(runs {', '.join(f'{r:.2f}' for r in speed['runs'])}); heads {row['heads_per_layer']}, neurons "
              f"{row['neurons_per_layer']}; FLOPs {row['flops_fraction']:.2f}", flush=True)

    heads_only = copy.deepcopy(model)
    top = scores.heads.argmax(dim=1).tolist()
    prune_heads(heads_only, {layer: [h] for layer, h in enumerate(top)})
    ceiling = _speed(model, heads_only, repeats=args.repeats, runs=args.runs)
    heads_flops = flops.predict(np.ones(flops.num_layers), np.full(flops.num_layers, flops.num_neurons))
    print(f"heads only, one per layer: measured x{ceiling['measured_speedup']:.2f}", flush=True)

    payload = {
        "model": (args.model or "all-MiniLM-L6-v2, pretrained encoder, fresh 5-class head (speed only)"),
        "shape": f"batch {BATCH} x {SEQ_LEN} tokens, PyTorch fp32, {args.threads} thread(s)",
        "importance_s": importance_s, "latency_table_s": table_s, "latency_table": costs.to_dict(),
        "reachable_speedup_predicted": costs.dense / costs.floor, "dense_accuracy": dense_accuracy,
        "targets": rows,
        "heads_only_one_per_layer": {**ceiling, "flops_fraction": heads_flops / flops.dense},
        "calibration_sentences": int(len(chosen)),
    }
    name = args.out or ("ffn_speed_accuracy.json" if args.model else "ffn_speed.json")
    path = save(name, payload, command="nice -n 10 python -m bench ffn_speed " + " ".join(argv or []),
                protocol=f"{args.threads} torch thread(s); Fisher importance on {len(chosen)} SST-5 training "
                f"sentences; latency table fitted on 8 uniform shapes (3 rounds x 3 passes, non-negative least "
                f"squares); speed-ups = dense p50 / pruned p50 of {args.repeats} alternating passes, median of "
                f"{args.runs} runs")
    print(f"saved {path}")


if __name__ == "__main__":
    main()
