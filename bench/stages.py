"""Cost of every CAHP stage on random BERT-shaped models: how the signature stage compares with the
forward passes it cannot avoid, what surgery, a fine-tuning epoch and an evaluation cost dense and
pruned, and how the sample-dependent stages grow with the number of samples.

Run: ``python -m bench stages [--threads 1] [--samples 2000] [--repeats 3] [--sections ...]``

``--sections`` reruns some sections only (shapes, sweep, memory, downstream, scaling); the others are
kept from the existing ``bench/results/stages.json``, and each section records its own command and date.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers as tf

from bench import common
from bench.common import PeakRss, pin_threads, save
from cahp_engine.data import EncodedDataset, draw_subset, iterate_batches, length_grouped_batches
from cahp_engine.models import eager_attention, prune_heads
from cahp_engine.recovery import TrainingRecipe, evaluate, finetune
from cahp_engine.selection import (
    embed_heads,
    extract_signatures,
    gradient_salience,
    knees_by_degree,
    minmax,
    mss_sweep,
    select_representatives,
    separation_features,
)

SHAPES = ((6, 12), (12, 12), (24, 16))
#: Section name -> its key in stages.json.
SECTIONS = {"shapes": "shapes", "sweep": "sweep_384", "memory": "memory", "downstream": "downstream",
            "scaling": "scaling"}
RESOLUTION = 32
NUM_CLASSES = 5


def synthetic_data(n: int, *, vocab: int, seed: int = 0) -> EncodedDataset:
    """Random token sequences whose lengths follow SST-5's shape (mean ~25 tokens, p95 ~45, max 64)."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.round(rng.lognormal(mean=3.1, sigma=0.45, size=n)), 4, 64).astype(np.int64)
    ids = tuple((101, *rng.integers(1000, vocab, size=int(k) - 2).tolist(), 102) for k in lengths)
    labels = np.arange(n) % NUM_CLASSES
    rng.shuffle(labels)
    return EncodedDataset(input_ids=ids, token_type_ids=None, labels=labels.astype(np.int64), lengths=lengths,
                          num_classes=NUM_CLASSES, pad_token_id=0)


def bert_shaped(layers: int, heads: int, head_dim: int, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    hidden = heads * head_dim
    config = tf.BertConfig(  # type: ignore[call-arg]
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                           intermediate_size=4 * hidden, num_labels=NUM_CLASSES, vocab_size=8000)
    return tf.BertForSequenceClassification(config).eval()


def plain_forward(model: torch.nn.Module, data: EncodedDataset, batches: list[np.ndarray]) -> float:
    """An eager no-grad forward with attentions over the same batches: the floor for signatures."""
    start = time.perf_counter()
    with eager_attention(model), torch.no_grad():
        for batch in iterate_batches(data, batches):
            model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_attentions=True)
    return time.perf_counter() - start


def forward_backward(model: torch.nn.Module, data: EncodedDataset, batches: list[np.ndarray]) -> float:
    """Forward and backward to the input embeddings (weights frozen): the floor for salience."""
    start = time.perf_counter()
    flags = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        emb: Any = getattr(model, "get_input_embeddings")()  # noqa: B009 - typed as Tensor by torch stubs
        for batch in iterate_batches(data, batches):
            x = emb(batch["input_ids"]).detach().requires_grad_(True)
            out = model(inputs_embeds=x, attention_mask=batch["attention_mask"], labels=batch["labels"])
            torch.autograd.grad(out.loss, x)
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)
    return time.perf_counter() - start


def _measured(fn: Any) -> tuple[float, float, Any]:
    """Wall time, extra peak resident memory (MiB) and result of ``fn()``."""
    gc.collect()
    with PeakRss() as mem:
        start = time.perf_counter()
        value = fn()
        elapsed = time.perf_counter() - start
    return elapsed, mem.extra_mib, value


def signature_run(model: torch.nn.Module, data: EncodedDataset, batches: list[np.ndarray]) -> tuple[float, Any, float]:
    elapsed, mib, sig = _measured(lambda: extract_signatures(model, iterate_batches(data, batches),
                                                             num_classes=NUM_CLASSES, resolution=RESOLUTION))
    return elapsed, sig, mib


def profile_shape(layers: int, heads: int, *, samples: int, head_dim: int, repeats: int, seed: int) -> dict[str, Any]:
    model = bert_shaped(layers, heads, head_dim, seed)
    data = synthetic_data(samples, vocab=8000, seed=seed)
    idx = np.arange(samples)
    batches = length_grouped_batches(data.lengths, idx, 32)
    plain, sig_times, mems = [], [], []
    sig = None
    for _ in range(repeats):  # interleaved so machine noise hits both alike
        plain.append(plain_forward(model, data, batches))
        t, sig, mib = signature_run(model, data, batches)
        sig_times.append(t)
        mems.append(mib)
    assert sig is not None
    out: dict[str, Any] = {
        "layers": layers, "heads": heads, "head_dim": head_dim, "heads_total": layers * heads,
        "samples": samples, "mean_tokens": float(data.lengths.mean()), "resolution": RESOLUTION,
        "plain_forward_s": {"median": statistics.median(plain), "runs": plain},
        "signatures_s": {"median": statistics.median(sig_times), "runs": sig_times},
        "signatures_peak_extra_mib": {"median": statistics.median(mems), "runs": mems},
    }
    out["signature_to_forward_ratio"] = out["signatures_s"]["median"] / out["plain_forward_s"]["median"]
    timings: dict[str, float] = {}
    t = time.perf_counter()
    feats = separation_features(sig)
    timings["separation"] = time.perf_counter() - t
    t = time.perf_counter()
    graph = embed_heads(feats.matrix, seed=seed)
    timings["graph_space"] = time.perf_counter() - t
    t = time.perf_counter()
    curve = mss_sweep(graph.points, seed=seed)
    timings["sweep"] = time.perf_counter() - t
    t = time.perf_counter()
    knees = knees_by_degree(curve.ks, curve.mss, (2, 3, 4, 5, 6))
    timings["knee"] = time.perf_counter() - t
    cal = draw_subset(samples, 0.25, seed=seed + 1, labels=data.labels)
    cal_batches = length_grouped_batches(data.lengths, cal, 32)
    t = time.perf_counter()
    sal = minmax(gradient_salience(model, iterate_batches(data, cal_batches))).numpy()
    timings["salience"] = time.perf_counter() - t
    timings["salience_floor_forward_backward"] = forward_backward(model, data, cal_batches)
    t = time.perf_counter()
    k = knees[2].k
    select_representatives(curve.at(k).labels, sal)
    timings["selection"] = time.perf_counter() - t
    out["stage_s"] = timings
    out["k_star_degree2"] = k
    selection_total = out["signatures_s"]["median"] + sum(
        v for name, v in timings.items() if name != "salience_floor_forward_backward")
    out["selection_total_s"] = selection_total
    out["floor_ratio"] = selection_total / (out["plain_forward_s"]["median"]
                                            + timings["salience_floor_forward_backward"])
    return out


def sweep_384(seed: int, repeats: int) -> dict[str, Any]:
    """The k sweep on N = 384 points (a BERT-large head count), from a clustered random graph space."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=20, size=(40, 2))
    points = centres[rng.integers(0, 40, size=384)] + rng.normal(size=(384, 2))
    runs = []
    for _ in range(repeats):
        t = time.perf_counter()
        mss_sweep(points, seed=seed)
        runs.append(time.perf_counter() - t)
    return {"n": 384, "ks": "2..383", "median_s": statistics.median(runs), "runs": runs}


def _warmed_up(n: int, head_dim: int, seed: int) -> tuple[torch.nn.Module, EncodedDataset, list[np.ndarray]]:
    """The 6x12 model, ``n`` samples and their longest-first batches, after a warm-up pass.

    The warm-up runs the signature stage over the 96 longest samples: the first pass of a process loads
    kernels and code pages, and the allocator's high-water mark follows the longest batch; both are
    fixed costs, not memory that grows with the number of samples.
    """
    model = bert_shaped(6, 12, head_dim, seed)
    data = synthetic_data(n, vocab=8000, seed=seed)
    longest = np.argsort(data.lengths)[-96:]
    signature_run(model, data, length_grouped_batches(data.lengths, longest, 32))
    return model, data, length_grouped_batches(data.lengths, np.arange(n), 32, longest_first=True)


def _memory_probe(n: int, head_dim: int, seed: int) -> dict[str, Any]:
    """One cold signature run in this process: the extra resident memory it needed at its peak."""
    model, data, batches = _warmed_up(n, head_dim, seed)
    t, _, mib = signature_run(model, data, batches)
    return {"samples": n, "signatures_s": t, "peak_extra_mib": mib}


def _in_fresh_process(probe: str, *, threads: int, trim_malloc: bool = True, **kwargs: Any) -> dict[str, Any]:
    """Run ``bench.stages.<probe>(**kwargs)`` in a new interpreter and return its JSON row.

    glibc keeps freed heap memory mapped, so RSS follows the allocator's fragmentation as well as live
    memory. With ``trim_malloc`` blocks above 128 KiB come from mmap and freed memory is returned at
    once, so RSS tracks what a stage holds; that costs time (about 1.4 x on a training epoch here), so
    the timings of such a run compare only with each other. Without it, the process behaves as a
    worker does by default: realistic times, and peak RSS as an operator would see it.
    """
    code = (
        f"import json, torch; torch.set_num_threads({threads}); from bench.stages import {probe}; "
        f"print(json.dumps({probe}(**json.loads({json.dumps(kwargs)!r}))))"
    )
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    if trim_malloc:
        env.update(MALLOC_MMAP_THRESHOLD_="131072", MALLOC_TRIM_THRESHOLD_="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def memory_flatness(samples: tuple[int, ...], *, head_dim: int, seed: int, threads: int) -> dict[str, Any]:
    """Peak extra memory of the signature stage as the sample count grows (6x12 model).

    Each size runs in a fresh process, so one size's freed pages cannot hide the next one's needs.
    """
    rows = [_in_fresh_process("_memory_probe", n=n, head_dim=head_dim, seed=seed, threads=threads) for n in samples]
    base = rows[0]["peak_extra_mib"]
    for row in rows:
        row["relative_to_first"] = row["peak_extra_mib"] / base if base else None
    return {"model": "6x12", "rows": rows}


# --------------------------------------------------------------------------- after the selection


def _one_epoch(model: torch.nn.Module, data: EncodedDataset, seed: int) -> Any:
    return finetune(model, data, TrainingRecipe(epochs=1.0, lr=2e-5, batch_size=32, warmup_ratio=0.1, weight_decay=0.01,
                                                max_grad_norm=1.0, seed=seed))


def half_of_each_layer(layers: int, heads: int) -> dict[int, list[int]]:
    """The keep set used for the cost figures: the first half of every layer's heads (50 % retention)."""
    return {layer: list(range(heads // 2)) for layer in range(layers)}


def _downstream_probe(layers: int, heads: int, pruned: bool, samples: int, head_dim: int, repeats: int,
                      seed: int) -> dict[str, Any]:
    """Surgery (when ``pruned``), evaluation and one fine-tuning epoch of one model, in this process."""
    data = synthetic_data(samples, vocab=8000, seed=seed)
    row: dict[str, Any] = {}
    if pruned:
        runs, mibs = [], []
        for _ in range(repeats):  # surgery is in place: a fresh model each time
            model = bert_shaped(layers, heads, head_dim, seed)
            t, mib, _ = _measured(lambda m=model: prune_heads(m, half_of_each_layer(layers, heads)))
            runs.append(t)
            mibs.append(mib)
        row["surgery_s"] = {"median": statistics.median(runs), "runs": runs}
        row["surgery_peak_extra_mib"] = statistics.median(mibs)
    else:
        model = bert_shaped(layers, heads, head_dim, seed)
    runs, mibs = [], []
    for _ in range(repeats):
        t, mib, _ = _measured(lambda: evaluate(model, data, batch_size=32))
        runs.append(t)
        mibs.append(mib)
    row["evaluation_s"] = {"median": statistics.median(runs), "runs": runs}
    row["evaluation_peak_extra_mib"] = max(mibs)  # the first pass is the one that allocates
    t, mib, training = _measured(lambda: _one_epoch(model, data, seed))
    row["finetune_epoch_s"] = training.seconds_per_epoch[0]
    row["finetune_peak_extra_mib"] = mib
    return row


def downstream_costs(layers: int, heads: int, *, samples: int, head_dim: int, repeats: int, seed: int,
                     threads: int) -> dict[str, Any]:
    """Surgery, one fine-tuning epoch and one evaluation pass, dense and at 50 % of heads.

    Dense and pruned run in fresh processes of their own, so neither inherits the other's freed memory,
    with glibc's default allocator settings: the times a worker sees and the peak resident memory an
    operator must provide.
    Surgery and evaluation are medians of ``repeats`` runs; a fine-tuning epoch, the costliest step
    here, runs once per model.
    """
    out: dict[str, Any] = {"layers": layers, "heads": heads, "head_dim": head_dim, "samples": samples,
                           "kept_fraction": 0.5}
    for name in ("dense", "pruned"):
        row = _in_fresh_process("_downstream_probe", threads=threads, trim_malloc=False, layers=layers, heads=heads,
                                pruned=name == "pruned", samples=samples, head_dim=head_dim, repeats=repeats,
                                seed=seed)
        if name == "pruned":
            out["surgery_s"] = row.pop("surgery_s")
            out["surgery_peak_extra_mib"] = row.pop("surgery_peak_extra_mib")
        out[name] = row
    out["pruned_to_dense"] = {
        "evaluation": out["pruned"]["evaluation_s"]["median"] / out["dense"]["evaluation_s"]["median"],
        "finetune_epoch": out["pruned"]["finetune_epoch_s"] / out["dense"]["finetune_epoch_s"],
        "finetune_peak_memory": out["pruned"]["finetune_peak_extra_mib"] / out["dense"]["finetune_peak_extra_mib"],
    }
    return out


def _scaling_probe(n: int, head_dim: int, seed: int) -> dict[str, Any]:
    """Every sample-dependent stage once on ``n`` samples (6x12 model), in this process."""
    model, data, everything = _warmed_up(n, head_dim, seed)
    row: dict[str, Any] = {"samples": n}
    t, _, mib = signature_run(model, data, everything)
    row["signatures"] = {"s": t, "peak_extra_mib": mib}
    cal = draw_subset(n, 0.25, seed=seed + 1, labels=data.labels)
    cal_batches = length_grouped_batches(data.lengths, cal, 32, longest_first=True)
    t, mib, _ = _measured(lambda: gradient_salience(model, iterate_batches(data, cal_batches)))
    row["salience"] = {"s": t, "peak_extra_mib": mib, "calibration_samples": int(len(cal))}
    t, mib, _ = _measured(lambda: evaluate(model, data, batch_size=32))
    row["evaluation"] = {"s": t, "peak_extra_mib": mib}
    t, mib, _ = _measured(lambda: _one_epoch(model, data, seed))
    row["finetune_epoch"] = {"s": t, "peak_extra_mib": mib}
    return row


def sample_scaling(samples: tuple[int, ...], *, head_dim: int, seed: int, threads: int) -> dict[str, Any]:
    """Time and peak memory of every stage that reads the samples, 6x12 model, one fresh process per size.

    The stages after the signatures (separation, graph space, sweep, knee, selection, surgery) see only
    the N heads, never the samples; how they grow with N is the ``shapes`` section.
    """
    rows = [_in_fresh_process("_scaling_probe", n=n, head_dim=head_dim, seed=seed, threads=threads) for n in samples]
    first = rows[0]
    for row in rows:
        factor = row["samples"] / first["samples"]
        for stage in ("signatures", "salience", "evaluation", "finetune_epoch"):
            row[stage]["time_per_sample_relative_to_first"] = row[stage]["s"] / first[stage]["s"] / factor
    return {"model": "6x12", "rows": rows}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench stages")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--head-dim", type=int, default=32, help="hidden = head_dim x heads (32: as in all-MiniLM-L6-v2)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--shapes", default=",".join(f"{layers}x{heads}" for layers, heads in SHAPES))
    p.add_argument("--memory-samples", default="1000,2000,4000,8000")
    p.add_argument("--downstream-samples", type=int, default=1000,
                   help="samples for the surgery / fine-tuning / evaluation costs (per-epoch time is linear in it)")
    p.add_argument("--sections", default=",".join(SECTIONS),
                   help=f"comma-separated subset of {', '.join(SECTIONS)}; the others are kept from the saved file")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    sections = [s for s in args.sections.split(",") if s]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        p.error(f"unknown section(s) {unknown}; choose from {', '.join(SECTIONS)}")
    pin_threads(args.threads)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s]
    cmd = ("python -m bench stages " + " ".join(argv or [])).strip()
    stamp = {"command": cmd, "date": datetime.now(UTC).isoformat(timespec="seconds")}
    previous = common.RESULTS / "stages.json"
    results: dict[str, Any] = {}
    if set(sections) != set(SECTIONS) and previous.is_file():
        old = json.loads(previous.read_text())
        results = {k: v for k, v in old.items() if k in SECTIONS.values() or k == "section_runs"}
        results.setdefault("section_runs", {name: {"command": old["command"], "date": old["date"]}
                                            for name, key in SECTIONS.items() if key in old})
    results.setdefault("section_runs", {})
    if "shapes" in sections:
        results["shapes"] = []
        for layers, heads in shapes:
            row = profile_shape(layers, heads, samples=args.samples, head_dim=args.head_dim, repeats=args.repeats,
                                seed=args.seed)
            results["shapes"].append(row)
            print(f"{layers}x{heads}: signatures {row['signatures_s']['median']:.2f} s vs plain forward "
                  f"{row['plain_forward_s']['median']:.2f} s (x{row['signature_to_forward_ratio']:.2f}); "
                  f"peak extra {row['signatures_peak_extra_mib']['median']:.0f} MiB; "
                  + ", ".join(f"{k} {v:.3f} s" for k, v in row["stage_s"].items())
                  + f"; floor ratio {row['floor_ratio']:.2f}", flush=True)
    if "sweep" in sections:
        results["sweep_384"] = sweep_384(args.seed, args.repeats)
        print(f"sweep N=384: {results['sweep_384']['median_s']:.3f} s", flush=True)
    mem_samples = tuple(int(v) for v in args.memory_samples.split(",") if v)
    if "memory" in sections and mem_samples:
        results["memory"] = memory_flatness(mem_samples, head_dim=args.head_dim, seed=args.seed,
                                             threads=args.threads)
        for row in results["memory"]["rows"]:
            print(f"memory {row['samples']} samples: peak extra {row['peak_extra_mib']:.1f} MiB "
                  f"(x{row['relative_to_first']:.2f} of the first)", flush=True)
    if "downstream" in sections:
        results["downstream"] = []
        for layers, heads in shapes:
            row = downstream_costs(layers, heads, samples=args.downstream_samples, head_dim=args.head_dim,
                                   repeats=args.repeats, seed=args.seed, threads=args.threads)
            results["downstream"].append(row)
            print(f"{layers}x{heads}: surgery {row['surgery_s']['median'] * 1e3:.1f} ms; "
                  + "; ".join(f"{name}: epoch {row[name]['finetune_epoch_s']:.1f} s, evaluation "
                              f"{row[name]['evaluation_s']['median']:.2f} s" for name in ("dense", "pruned")),
                  flush=True)
    if "scaling" in sections and mem_samples:
        results["scaling"] = sample_scaling(mem_samples, head_dim=args.head_dim, seed=args.seed,
                                            threads=args.threads)
        for row in results["scaling"]["rows"]:
            print(f"scaling {row['samples']} samples: " + ", ".join(
                f"{stage} {row[stage]['s']:.1f} s / {row[stage]['peak_extra_mib']:.0f} MiB"
                for stage in ("signatures", "salience", "evaluation", "finetune_epoch")), flush=True)
    for name in sections:
        results["section_runs"][name] = stamp
    path = save("stages.json", results, command=cmd,
                protocol=f"random BERT-shaped models (head_dim {args.head_dim}, 5 classes), {args.samples} "
                f"synthetic samples with SST-5-like lengths ({args.downstream_samples} for surgery, fine-tuning "
                f"and evaluation; 1k-8k for the memory and scaling probes, one fresh process per size), "
                f"B={RESOLUTION}, batch 32 length-grouped, {args.threads} torch thread(s), medians of "
                f"{args.repeats} interleaved runs where a section repeats")
    print(f"saved {path}")
