"""How much faster a pruned encoder runs than the dense one, next to what its removed FLOPs predict.

For each model, each retention near 50%, 25% and 15% of the heads, each sequence length and each batch
size, the dense model and its pruned copy are timed with :func:`cahp_engine.recovery.compare_speed`
(timed passes alternate between the two, so machine noise hits both). The speed-up measured at the
median (p50) latency is put next to the speed-up predicted by counting the FLOPs of one forward pass.

Which heads go does not change the FLOPs, only how many each layer keeps; the heads are drawn with a
seeded uniform random rule that, like CAHP's layer safety, leaves every layer at least one head
(:func:`random_heads`, ``--seed``), and the per-layer counts are saved with each row.

Run: ``python -m bench speed [--threads 1] [--repeats 20] [--large-repeats 3] [--models minilm,bert-base]``
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import nn

from bench.common import minilm_path, pin_threads, save
from bench.stages import bert_shaped
from cahp_engine.models import get_adapter, heads_per_layer, load_classifier, prune_heads
from cahp_engine.recovery import compare_speed

RETENTIONS = (0.50, 0.25, 0.15)
MODELS = ("minilm", "bert-base")


@dataclass(frozen=True)
class EncoderShape:
    """What the FLOP count needs of a BERT-like encoder: one entry per layer for the heads."""

    heads_per_layer: tuple[int, ...]
    head_dim: int
    hidden: int
    intermediate: int


def encoder_shape(model: nn.Module) -> EncoderShape:
    """The shape of ``model`` as it is now (pruned layers report the heads they still have)."""
    adapter = get_adapter(model)
    config: Any = model.config
    return EncoderShape(
        heads_per_layer=tuple(heads_per_layer(model)),
        head_dim=adapter.head_dim(config),
        hidden=int(config.hidden_size),
        intermediate=int(config.intermediate_size),
    )


def flops_per_token(shape: EncoderShape, seq_len: int) -> dict[str, float]:
    """FLOPs of one encoder forward pass per token (a multiply-add counts 2), split by block.

    Per layer with ``h`` heads of width ``d`` (``a = h * d``), hidden size ``D``, feed-forward size
    ``I`` and ``T`` tokens: q, k and v projections ``3 * 2 * D * a``, the output projection
    ``2 * a * D``, scores QK^T ``2 * T * a`` and the weighted sum AV ``2 * T * a``, the feed-forward
    block ``2 * 2 * D * I``. Embeddings, biases, softmax, layer norms, the pooler and the classifier
    are left out: they are small next to these or do not change with pruning.

    Returns
    -------
    dict
        ``projections``, ``scores`` (QK^T and AV), ``feed_forward`` and ``total``.
    """
    d_model, inner = shape.hidden, shape.intermediate
    widths = [h * shape.head_dim for h in shape.heads_per_layer]
    projections = sum(8.0 * d_model * a for a in widths)
    scores = sum(4.0 * seq_len * a for a in widths)
    feed_forward = len(widths) * 4.0 * d_model * inner
    return {"projections": projections, "scores": scores, "feed_forward": feed_forward,
            "total": projections + scores + feed_forward}


def predicted_speedup(dense: EncoderShape, pruned: EncoderShape, seq_len: int) -> float:
    """Dense FLOPs over pruned FLOPs: the speed-up if time were proportional to arithmetic."""
    return flops_per_token(dense, seq_len)["total"] / flops_per_token(pruned, seq_len)["total"]


def random_heads(layers: int, heads: int, count: int, *, seed: int) -> dict[int, list[int]]:
    """``count`` heads drawn uniformly with ``seed``, at least one per layer.

    CAHP's layer-safety rule never leaves a layer without heads, and a head-less layer skips its
    attention kernel altogether (faster than its FLOPs say), so the benchmark keeps one random head in
    each layer first and draws the rest from all remaining heads.
    """
    if not layers <= count <= layers * heads:
        raise ValueError(f"count must be between {layers} and {layers * heads}, got {count}")
    rng = np.random.default_rng(seed)
    mask = np.zeros((layers, heads), dtype=bool)
    mask[np.arange(layers), rng.integers(0, heads, size=layers)] = True
    rest = np.flatnonzero(~mask.reshape(-1))
    mask.reshape(-1)[rng.choice(rest, size=count - layers, replace=False)] = True
    return {layer: np.flatnonzero(row).tolist() for layer, row in enumerate(mask)}


def pruned_copy(model: nn.Module, retention: float, *, seed: int) -> tuple[nn.Module, int]:
    """A copy of ``model`` keeping ``round(retention * N)`` heads (see :func:`random_heads`)."""
    layers, heads = len(heads_per_layer(model)), heads_per_layer(model)[0]
    count = max(layers, round(retention * layers * heads))
    pruned = copy.deepcopy(model)
    prune_heads(pruned, random_heads(layers, heads, count, seed=seed))
    return pruned.eval(), count


def build_model(name: str) -> tuple[nn.Module, str]:
    if name == "minilm":
        return load_classifier(minilm_path(), num_labels=5).model.eval(), "all-MiniLM-L6-v2 (6x12 heads, hidden 384)"
    if name == "bert-base":
        return bert_shaped(12, 12, 64, seed=0), "random BERT-base shape (12x12 heads, hidden 768, FFN 3072)"
    raise SystemExit(f"unknown model {name!r}; choose from {', '.join(MODELS)}")


def _latency(row: dict[str, Any]) -> dict[str, float]:
    return {key: row[key] for key in ("p50_ms", "p95_ms", "mean_ms", "throughput_per_s")}


def measure_model(name: str, *, retentions: Sequence[float], seq_lens: Sequence[int], batch_sizes: Sequence[int],
                  counts: dict[int, tuple[int, int]], seed: int) -> dict[str, Any]:
    """Every (retention, seq_len, batch) row of one model; ``counts[batch] = (warmup, repeats)``."""
    start = time.perf_counter()
    model, description = build_model(name)
    dense_shape = encoder_shape(model)
    rows: list[dict[str, Any]] = []
    for retention in retentions:
        pruned, kept = pruned_copy(model, retention, seed=seed)
        shape = encoder_shape(pruned)
        for seq_len in seq_lens:
            dense_flops, pruned_flops = flops_per_token(dense_shape, seq_len), flops_per_token(shape, seq_len)
            predicted = dense_flops["total"] / pruned_flops["total"]
            for batch in batch_sizes:
                warmup, repeats = counts[batch]
                speed = compare_speed(model, pruned, batch_sizes=(batch,), seq_len=seq_len, warmup=warmup,
                                      repeats=repeats, seed=seed)
                result = speed.results[0].to_dict()
                measured = result["speedup"]
                rows.append({
                    "retention_target": retention, "heads_kept": kept,
                    "retention": kept / sum(dense_shape.heads_per_layer),
                    "heads_per_layer": list(shape.heads_per_layer), "seq_len": seq_len, "batch_size": batch,
                    "warmup": warmup, "repeats": repeats,
                    "dense": _latency(result["dense"]), "pruned": _latency(result["pruned"]),
                    "measured_speedup": measured, "predicted_speedup": predicted,
                    "measured_over_predicted": measured / predicted,
                    "gflops_per_token": {"dense": dense_flops["total"] / 1e9, "pruned": pruned_flops["total"] / 1e9},
                    "dense_attention_flop_share": (dense_flops["projections"] + dense_flops["scores"])
                    / dense_flops["total"],
                })
                print(f"{name} keep {kept:3d} ({rows[-1]['retention']:.1%}) T={seq_len:3d} B={batch:2d}: dense "
                      f"p50 {result['dense']['p50_ms']:8.1f} ms, pruned {result['pruned']['p50_ms']:8.1f} ms; "
                      f"speed-up x{measured:.2f} measured / x{predicted:.2f} predicted = {measured / predicted:.2f}",
                      flush=True)
    return {"model": name, "description": description, "heads_total": sum(dense_shape.heads_per_layer),
            "head_dim": dense_shape.head_dim, "hidden": dense_shape.hidden,
            "intermediate": dense_shape.intermediate, "wall_s": time.perf_counter() - start, "rows": rows}


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench speed")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {', '.join(MODELS)}")
    p.add_argument("--retentions", default=",".join(str(r) for r in RETENTIONS))
    p.add_argument("--seq-lens", default="64,128")
    p.add_argument("--batch-sizes", default="1,32")
    p.add_argument("--repeats", type=int, default=20, help="timed passes per model for batches below 8")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--large-repeats", type=int, default=3,
                   help="timed passes per model for batches of 8 or more (each takes seconds on a CPU)")
    p.add_argument("--large-warmup", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    pin_threads(args.threads)
    batch_sizes = _ints(args.batch_sizes)
    counts = {b: (args.large_warmup, args.large_repeats) if b >= 8 else (args.warmup, args.repeats)
              for b in batch_sizes}
    retentions = [float(v) for v in args.retentions.split(",") if v]
    start = time.perf_counter()
    models = [measure_model(name, retentions=retentions, seq_lens=_ints(args.seq_lens), batch_sizes=batch_sizes,
                            counts=counts, seed=args.seed)
              for name in args.models.split(",") if name]
    wall = time.perf_counter() - start
    cmd = ("python -m bench speed " + " ".join(argv or [])).strip()
    protocol = (f"CPU forward passes under no_grad, {args.threads} torch thread(s); random token ids, full "
                "attention mask; heads kept by seeded uniform random choice with at least one per layer "
                f"(seed {args.seed}); dense and pruned passes alternate (compare_speed); batches < 8: "
                f"{args.warmup} warm-up + {args.repeats} "
                f"timed passes, batches >= 8: {args.large_warmup} + {args.large_repeats}; speed-up = dense p50 / "
                "pruned p50; predicted = encoder FLOPs per token dense / pruned (q/k/v/o projections, QK^T and "
                "AV, feed-forward; embeddings, norms, pooler and classifier left out)")
    path = save("speed.json", {"models": models, "wall_s": wall}, command=cmd, protocol=protocol)
    print(f"saved {path} ({wall:.0f} s)")
