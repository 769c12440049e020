"""How fast do the selection's statistics converge on all-MiniLM-L6-v2 + SST-5? The measurements behind
the stopping rules of ``cahp_engine/selection/_convergence.py``.

Phase ``collect`` makes one signature pass over every training sentence in the seeded stratified
order (K = 5 shards), keeping a snapshot of the per-shard statistics at a ladder of sample counts,
and one calibration pass over every sentence, keeping each batch's absolute gate gradients. Phase
``analyse`` then replays any stopping rule offline: for each snapshot the cheap stages
(separation -> graph space -> sweep -> knees) and CAHP's choice, against the full-data selection.

CAHP's choice is :func:`cahp_engine.selection.select_representatives`, the rule the registry's ``cahp``
strategy runs, called on each replayed partition directly: the study works below
:func:`~cahp_engine.selection.analyze_heads` (signature snapshots, salience from batch prefixes) and so
has no ``HeadAnalysis`` to hand to :func:`~cahp_engine.selection.choose`.

Run: ``python -m studies convergence-study --dense DIR [--phase collect|analyse|both]``
(``DIR``: the dense fine-tuned model, e.g. ``studies/results/cache/quality_sst5/dense`` made by
``python -m studies quality``). Both phases resume on the same checkout: finished snapshots are kept in
``--work`` (default studies/results/cache/convergence_study/, not tracked by git).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.stats import spearmanr

from cahp_engine.data import DatasetOptions, encode, iterate_batches, length_grouped_batches, load_splits, take_rows
from cahp_engine.models import load_classifier
from cahp_engine.selection import (
    ShardedSignatures,
    SignatureProfiler,
    class_difference_noise,
    default_perplexity,
    gradient_salience,
    head_structure,
    minmax,
    salience_noise,
    select_representatives,
    stratified_order,
)
from studies.common import RESULTS, SST5, pin_threads, save

SIZES = (128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8544)
DEGREES = (2, 3, 4, 5, 6)
SHARDS = 5
CHUNK = 128


def collect(dense: str, work: Path, *, seed: int, resolution: int) -> None:
    work.mkdir(parents=True, exist_ok=True)
    splits = load_splits(SST5, DatasetOptions(eval_split="test"))
    loaded = load_classifier(dense)
    model = loaded.model.eval()
    train = encode(loaded.tokenizer, splits.train, max_length=512)
    n = len(train)
    sizes = [s for s in SIZES if s < n] + [n]
    if not all((work / f"sig-{s}.npz").is_file() for s in sizes):
        order = stratified_order(train.labels, seed=seed, shards=SHARDS)
        start = time.perf_counter()
        with SignatureProfiler(model, num_classes=train.num_classes, resolution=resolution,
                               shards=SHARDS) as prof:
            done = 0
            for size in sizes:
                while done < size:
                    stop = min(size, done + CHUNK)
                    idx = np.arange(done, stop)
                    chunk = take_rows(train, order.rows[idx])
                    for b in length_grouped_batches(chunk.lengths, np.arange(len(chunk)), 32, longest_first=True):
                        batch = next(iterate_batches(chunk, [b]))
                        prof.update(batch, torch.as_tensor(order.shard[idx][b]))
                    done = stop
                snap = prof.snapshot()
                np.savez(work / f"sig-{size}.npz", counts=snap.counts, mean=snap.mean, m2=snap.m2)
                print(f"signatures {size} at {time.perf_counter() - start:.1f} s", flush=True)
    if not (work / "salience.npz").is_file():
        order = stratified_order(train.labels, seed=seed + 1, shards=SHARDS)
        rng = np.random.default_rng(seed + 2)
        grads, sizes_b = [], []
        start = time.perf_counter()
        for a in range(0, n, CHUNK):
            chunk = take_rows(train, order.rows[a:a + CHUNK])
            batches = length_grouped_batches(chunk.lengths, np.arange(len(chunk)), 32, longest_first=True)
            for i in rng.permutation(len(batches)):
                batch = next(iterate_batches(chunk, [batches[i]]))
                grads.append(gradient_salience(model, [batch]).numpy())
                sizes_b.append(len(batches[i]))
            if (a // CHUNK) % 8 == 0:
                print(f"salience {a + len(chunk)} at {time.perf_counter() - start:.1f} s", flush=True)
        np.savez(work / "salience.npz", grads=np.stack(grads), sizes=np.asarray(sizes_b))
    (work / "meta.json").write_text(json.dumps({"n": n, "sizes": sizes, "resolution": resolution, "seed": seed,
                                                 "num_classes": train.num_classes}))


def _load(work: Path, size: int, meta: dict[str, Any]) -> ShardedSignatures:
    z = np.load(work / f"sig-{size}.npz")
    return ShardedSignatures(counts=z["counts"], mean=z["mean"], m2=z["m2"], resolution=meta["resolution"],
                             num_layers=6, num_heads=12)


def _jac(a: np.ndarray, b: np.ndarray) -> float:
    return float((a & b).sum() / max((a | b).sum(), 1))


def _features_distance(sig: Any, var_floor: float) -> np.ndarray:
    from scipy.spatial.distance import pdist

    from cahp_engine.selection import separation_features

    return pdist(separation_features(sig, var_floor=var_floor).matrix)


def analyse(work: Path, *, seed: int, var_floor: float, perplexity: float | None) -> dict[str, Any]:
    meta = json.loads((work / "meta.json").read_text())
    sal = np.load(work / "salience.npz")
    grads, bsz = sal["grads"], sal["sizes"]
    full_sal = minmax(torch.as_tensor(grads.mean(axis=0))).numpy()
    cum_rows = np.cumsum(bsz)

    def structure(sig: Any) -> Any:
        return head_structure(sig, var_floor=var_floor, perplexity=perplexity, seed=seed, degrees=DEGREES)

    def kept(struct: Any, degree: int, salience: np.ndarray) -> tuple[int, np.ndarray]:
        k = struct.knees[degree].k
        return k, select_representatives(struct.curve.at(k).labels, salience).kept_mask

    sizes = meta["sizes"]
    full = structure(_load(work, sizes[-1], meta).merged())
    ref = {d: kept(full, d, full_sal) for d in DEGREES}
    rows = []
    prev: dict[int, tuple[int, np.ndarray]] | None = None
    for size in sizes:
        t = time.perf_counter()
        sharded = _load(work, size, meta)
        struct = structure(sharded.merged())
        cheap_s = time.perf_counter() - t
        now = {d: kept(struct, d, full_sal) for d in DEGREES}
        loso = []
        for leave in range(SHARDS):
            s = structure(sharded.merged(leave))
            loso.append({d: kept(s, d, full_sal) for d in DEGREES})
        # Jackknife reliability of the head-to-head distances in feature space.
        dist = _features_distance(sharded.merged(), var_floor)
        jack = np.stack([_features_distance(sharded.merged(k), var_floor) for k in range(SHARDS)])
        jvar = (SHARDS - 1) / SHARDS * ((jack - jack.mean(axis=0)) ** 2).sum(axis=0)
        reliability = 1.0 - float(jvar.mean() / dist.var())
        row: dict[str, Any] = {"samples": size, "cheap_stages_s": cheap_s,
                               "class_difference_noise": class_difference_noise(sharded.merged(), var_floor=var_floor),
                               "distance_reliability": reliability,
                               "distance_rel_se_median": float(np.median(np.sqrt(jvar) / dist))}
        for d in DEGREES:
            row[f"d{d}"] = {
                "k": now[d][0], "k_full": ref[d][0],
                "jaccard_full": _jac(now[d][1], ref[d][1]),
                "jaccard_prev": None if prev is None else _jac(now[d][1], prev[d][1]),
                "k_prev": None if prev is None else prev[d][0],
                "loso_mean_jaccard": statistics.fmean(_jac(a[d][1], b[d][1]) for a, b in
                                                      itertools.combinations(loso, 2)),
                "loso_ks": [x[d][0] for x in loso],
            }
        rows.append(row)
        prev = now
        print(json.dumps({k: (v if not isinstance(v, dict) else {kk: vv for kk, vv in v.items()
                                                                  if kk in ("k", "jaccard_full", "jaccard_prev",
                                                                            "loso_mean_jaccard")})
                          for k, v in row.items()}), flush=True)
    # Salience: running means over batch prefixes, against the full-data mean.
    sal_rows = []
    prev_s = None
    for rows_target in (128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, int(cum_rows[-1])):
        m = int(np.searchsorted(cum_rows, rows_target) + 1)
        s_now = minmax(torch.as_tensor(grads[:m].mean(axis=0))).numpy()
        half_a = grads[:m][0::2].mean(axis=0)
        half_b = grads[:m][1::2].mean(axis=0)
        split = float(spearmanr(half_a.ravel(), half_b.ravel())[0]) if m > 1 else None
        flat = grads[:m].reshape(m, *grads.shape[1:])
        entry: dict[str, Any] = {
            "samples": int(cum_rows[m - 1]), "batches": m,
            "salience_noise": salience_noise(flat.sum(axis=0), (flat**2).sum(axis=0), m),
            "spearman_full": float(spearmanr(s_now.ravel(), full_sal.ravel())[0]),
            "spearman_prev": None if prev_s is None else float(spearmanr(s_now.ravel(), prev_s.ravel())[0]),
            "split_half_spearman": split,
            "max_abs_diff_full": float(np.abs(s_now - full_sal).max()),
        }
        for d in (2, 6):
            k = full.knees[d].k
            entry[f"jaccard_full_d{d}"] = _jac(select_representatives(full.curve.at(k).labels, s_now).kept_mask,
                                               ref[d][1])
        sal_rows.append(entry)
        prev_s = s_now
        print(json.dumps(entry), flush=True)
    return {"signatures": rows, "salience": sal_rows, "meta": meta,
            "perturbation": perturbation(work, meta, full_sal, ref, seed=seed, var_floor=var_floor,
                                         perplexity=perplexity),
            "perplexity": perplexity or default_perplexity(72), "var_floor": var_floor}


def perturbation(work: Path, meta: dict[str, Any], salience: np.ndarray, ref: dict[int, tuple[int, np.ndarray]], *,
                 seed: int, var_floor: float, perplexity: float | None) -> dict[str, Any]:
    """How far the full-data selection moves when nothing about the data changes: Gaussian noise of a
    given size added to the JM features (before their rounding to 6 decimals), and other FasterPAM seeds."""
    from cahp_engine.selection import embed_heads, knees_by_degree, mss_sweep, separation_features

    features = separation_features(_load(work, meta["sizes"][-1], meta).merged(), var_floor=var_floor).matrix
    perp = perplexity or default_perplexity(features.shape[0])
    rng = np.random.default_rng(0)

    def choice(points: np.ndarray, pam_seed: int) -> dict[str, Any]:
        curve = mss_sweep(points, seed=pam_seed)
        knees = knees_by_degree(curve.ks, curve.mss, [2, 6])
        out = {}
        for d in (2, 6):
            kept = select_representatives(curve.at(knees[d].k).labels, salience).kept_mask
            out[f"d{d}"] = {"k": knees[d].k, "jaccard_full": _jac(kept, ref[d][1])}
        return out

    base = embed_heads(features, seed=seed, perplexity=perp)
    noise = {}
    for scale in (1e-7, 1e-6, 1e-5, 1e-4, 1e-3):
        graph = embed_heads(features + rng.normal(scale=scale, size=features.shape), seed=seed, perplexity=perp)
        noise[f"{scale:g}"] = {**choice(graph.points, seed),
                               "largest_point_move": float(np.abs(graph.points - base.points).max()),
                               "graph_space_std": float(base.points.std())}
    pam = {str(s): choice(base.points, s) for s in (seed + 1, seed + 2, seed + 3)}
    return {"feature_noise": noise, "fasterpam_seed": pam,
            "feature_std": float(features.std()), "feature_mean": float(features.mean())}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m studies convergence-study")
    p.add_argument("--dense", required=True, help="the dense fine-tuned all-MiniLM-L6-v2 directory")
    p.add_argument("--work", type=Path, default=RESULTS / "cache" / "convergence_study")
    p.add_argument("--phase", choices=("collect", "analyse", "both"), default="both")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--resolution", type=int, default=32)
    p.add_argument("--var-floor", type=float, default=1e-6)
    p.add_argument("--perplexity", type=float, default=None)
    p.add_argument("--out", default="convergence_study.json")
    args = p.parse_args(argv)
    pin_threads(1)
    if args.phase in ("collect", "both"):
        collect(args.dense, args.work, seed=args.seed, resolution=args.resolution)
    if args.phase in ("analyse", "both"):
        payload = analyse(args.work, seed=args.seed, var_floor=args.var_floor, perplexity=args.perplexity)
        save(args.out, payload, command="python -m studies convergence-study " + " ".join(argv or []),
             protocol=f"all-MiniLM-L6-v2 fine-tuned on SST-5; B={args.resolution}; K={SHARDS} shards; stratified "
             f"order seed {args.seed}; var floor {args.var_floor}; perplexity {args.perplexity or 'default'}")
