"""What a deployer sees: all-MiniLM-L6-v2 exported to ONNX, dense and pruned, fp32 and int8, on the CPU.

The dense model and a pruned copy are exported with :func:`cahp_engine.export.export_onnx` (export time
and parity recorded), the ONNX graphs are quantized with :func:`cahp_engine.export.quantize_int8` (per
output channel, and per tensor for comparison), and everything is timed together with
:func:`cahp_engine.export.compare_runtimes` against the dense PyTorch fp32 model: the same random
token ids, full attention mask, timed passes interleaved so machine noise hits all candidates alike.

By default the pruned copy keeps half of each layer's heads, drawn with a seeded uniform rule, and
the classifier head is untrained (latency does not depend on either). For accuracies, pass fine-tuned
checkpoints and the dataset: ``--dense`` (e.g. the dense model cached by ``python -m studies quality``),
``--pruned`` (a ``cahp prune`` run's ``model/``) and ``--accuracy`` (SST-5's test split unless ``--data``).

Run: ``python -m bench onnx-speed [--threads 1] [--repeats 20] [--large-repeats 5] [--seq-len 64]``
"""

from __future__ import annotations

import argparse
import copy
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bench.common import SST5, minilm_path, pin_threads, save
from cahp_engine.data import DatasetOptions, EncodedDataset, encode, load_splits
from cahp_engine.export import compare_runtimes, evaluate_onnx, export_onnx, quantize_int8
from cahp_engine.models import heads_per_layer, load_classifier, load_pruned, prune_heads
from cahp_engine.recovery import count_parameters, evaluate

#: Candidate name -> (runtime, model, precision), for the table and the figures.
CANDIDATES = {
    "torch_dense": ("PyTorch", "dense", "fp32"),
    "torch_pruned": ("PyTorch", "pruned", "fp32"),
    "onnx_dense": ("onnxruntime", "dense", "fp32"),
    "onnx_pruned": ("onnxruntime", "pruned", "fp32"),
    "onnx_dense_int8": ("onnxruntime", "dense", "int8 per channel"),
    "onnx_pruned_int8": ("onnxruntime", "pruned", "int8 per channel"),
    "onnx_pruned_int8_per_tensor": ("onnxruntime", "pruned", "int8 per tensor"),
}


def half_heads(model: nn.Module, *, seed: int) -> dict[int, list[int]]:
    """Half of every layer's heads (rounded up), drawn uniformly with ``seed``."""
    rng = np.random.default_rng(seed)
    return {layer: sorted(rng.choice(count, size=(count + 1) // 2, replace=False).tolist())
            for layer, count in enumerate(heads_per_layer(model))}


def measure(dense: nn.Module, pruned: nn.Module, tokenizer: Any, work: Path, *, rows: EncodedDataset | None,
            batch_sizes: tuple[int, ...], seq_len: int, counts: dict[int, tuple[int, int]], seed: int,
            say: Any = print) -> dict[str, Any]:
    """Export, quantize, score (when ``rows``) and time; ``counts[batch] = (warmup, repeats)``."""
    exports = {}
    for name, model in (("onnx_dense", dense), ("onnx_pruned", pruned)):
        exports[name] = export_onnx(model, tokenizer, work / name, data=rows, seed=seed)
        parity = exports[name].parity
        assert parity is not None
        say(f"{name}: exported in {exports[name].export_s:.1f} s, {exports[name].size_bytes / 2**20:.1f} MiB, "
            f"parity {parity.max_abs_diff:.2e} on {parity.samples} {parity.source} samples")
    int8 = {}
    for name, source, model, per_channel in (
        ("onnx_dense_int8", "onnx_dense", dense, True),
        ("onnx_pruned_int8", "onnx_pruned", pruned, True),
        ("onnx_pruned_int8_per_tensor", "onnx_pruned", pruned, False),
    ):
        int8[name] = quantize_int8(work / source, work / name, model=model, parity_data=rows, eval_data=rows,
                                   per_channel=per_channel, seed=seed)
        deviation = int8[name].deviation
        assert deviation is not None
        say(f"{name}: quantized in {int8[name].quantize_s:.1f} s, {int8[name].size_bytes / 2**20:.1f} MiB, "
            f"max |logit diff| vs PyTorch {deviation.max_abs_diff:.3g}, "
            f"same class {deviation.prediction_agreement:.1%}")

    accuracy = None
    if rows is not None:
        accuracy = {"torch_dense": evaluate(dense, rows).accuracy, "torch_pruned": evaluate(pruned, rows).accuracy,
                    "onnx_pruned": evaluate_onnx(work / "onnx_pruned", rows).accuracy}
        accuracy |= {name: result.accuracy.accuracy for name, result in int8.items() if result.accuracy is not None}
        say("accuracy: " + ", ".join(f"{k} {v:.4f}" for k, v in accuracy.items()))

    rows_out: list[dict[str, Any]] = []
    graphs = {name: work / name for name in ("onnx_dense", "onnx_pruned", *int8)}
    for batch in batch_sizes:
        warmup, repeats = counts[batch]
        speed = compare_runtimes(graphs, torch_models={"torch_dense": dense, "torch_pruned": pruned},
                                 baseline="torch_dense", batch_sizes=(batch,), seq_len=seq_len, warmup=warmup,
                                 repeats=repeats, seed=seed)
        result = speed.results[0]
        rows_out.append({
            "batch_size": batch, "seq_len": seq_len, "warmup": warmup, "repeats": repeats, "threads": speed.threads,
            "latency_ms": {name: {"p50": lat.p50_ms, "p95": lat.p95_ms, "mean": lat.mean_ms}
                           for name, lat in result.latency.items()},
            "speedup_vs_torch_dense": result.speedup,
        })
        say(f"B={batch:2d} T={seq_len}: " + ", ".join(f"{name} {lat.p50_ms:.1f} ms (x{result.speedup[name]:.2f})"
                                                     for name, lat in result.latency.items()))
    return {
        "heads_per_layer": {"dense": list(heads_per_layer(dense)), "pruned": list(heads_per_layer(pruned))},
        "parameters": {"dense": count_parameters(dense).total, "pruned": count_parameters(pruned).total},
        "candidates": {name: dict(zip(("runtime", "model", "precision"), spec, strict=True))
                       for name, spec in CANDIDATES.items()},
        "export": {name: {"export_s": e.export_s, "size_bytes": e.size_bytes, "inputs": list(e.inputs),
                          "opset": e.opset, "parity": e.parity.to_dict() if e.parity else None}
                   for name, e in exports.items()},
        "int8": {name: {"quantize_s": q.quantize_s, "size_bytes": q.size_bytes, "per_channel": q.per_channel,
                        "quantized_nodes": q.quantized_nodes,
                        "deviation": q.deviation.to_dict() if q.deviation else None}
                 for name, q in int8.items()},
        "accuracy": accuracy,
        "speed": rows_out,
        "versions": next(iter(exports.values())).versions,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench onnx-speed")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--batch-sizes", default="1,32")
    p.add_argument("--repeats", type=int, default=20, help="timed passes per candidate for batches below 8")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--large-repeats", type=int, default=5, help="timed passes per candidate for batches of 8 or more")
    p.add_argument("--large-warmup", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dense", default=None, help="a fine-tuned dense checkpoint (default: all-MiniLM-L6-v2, "
                   "classifier untrained)")
    p.add_argument("--pruned", default=None, help="a pruned checkpoint, e.g. a cahp prune run's model/ "
                   "(default: the dense model keeping half of each layer's heads, seeded)")
    p.add_argument("--num-labels", type=int, default=5, help="classes of the untrained head (default 5, SST-5)")
    p.add_argument("--accuracy", action="store_true", help="score every candidate on --data's evaluation split")
    p.add_argument("--data", default=str(SST5), help="dataset for --accuracy and parity (default SST-5)")
    p.add_argument("--eval-split", default="test")
    p.add_argument("--output", default="onnx_speed.json", help="file name under bench/results/")
    args = p.parse_args(argv)
    pin_threads(args.threads)
    started = time.perf_counter()
    torch.manual_seed(args.seed)  # the untrained classifier head, so that reruns compare the same logits

    loaded = load_classifier(args.dense or minilm_path(), num_labels=None if args.dense else args.num_labels)
    dense, tokenizer = loaded.model.eval(), loaded.tokenizer
    if args.pruned:
        pruned, how = load_pruned(args.pruned), f"checkpoint {args.pruned}"
    else:
        pruned = copy.deepcopy(dense)
        prune_heads(pruned, half_heads(dense, seed=args.seed))
        how = f"half of each layer's heads, seeded uniform draw (seed {args.seed})"
    pruned.eval()
    rows = None
    if args.accuracy:
        splits = load_splits(args.data, DatasetOptions(eval_split=args.eval_split))
        rows = encode(tokenizer, splits.eval, max_length=512)
    batch_sizes = tuple(int(v) for v in args.batch_sizes.split(",") if v)
    counts = {b: (args.large_warmup, args.large_repeats) if b >= 8 else (args.warmup, args.repeats)
              for b in batch_sizes}
    with tempfile.TemporaryDirectory(prefix="cahp-onnx-bench-") as tmp:
        figures = measure(dense, pruned, tokenizer, Path(tmp), rows=rows, batch_sizes=batch_sizes,
                          seq_len=args.seq_len, counts=counts, seed=args.seed)
    wall = time.perf_counter() - started
    payload = {
        "model": args.dense or "all-MiniLM-L6-v2 (6x12 heads, hidden 384), classifier head untrained",
        "pruned": how,
        "dataset": f"{args.data} ({args.eval_split}, {len(rows)} rows)" if rows is not None else None,
        **figures,
        "wall_s": wall,
    }
    cmd = ("python -m bench onnx-speed " + " ".join(argv or [])).strip()
    protocol = (f"CPU, {args.threads} thread(s) for torch and onnxruntime (intra-op; inter-op 1, ORT_ENABLE_ALL); "
                "random token ids (vocabulary minus special ids), full attention mask, "
                f"sequence length {args.seq_len}; all candidates timed together, passes interleaved and reversed "
                f"every other round; batches < 8: {args.warmup} warm-up + {args.repeats} timed passes, batches >= 8: "
                f"{args.large_warmup} + {args.large_repeats}; speed-up = torch_dense p50 / candidate p50. Export: "
                "torch.onnx.export(dynamo=True), opset 18, parity on "
                + ("the evaluation rows" if rows is not None else "64 random-id rows")
                + ", padded right and left; int8: onnxruntime quantize_dynamic (QInt8 weights, uint8 activations)")
    path = save(args.output, payload, command=cmd, protocol=protocol)
    print(f"saved {path} ({wall:.0f} s)")
