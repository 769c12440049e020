"""Layer-wise reconstruction on a real model: how much of the pruning gap it closes, and in how long.

all-MiniLM-L6-v2 fine-tuned densely on SST-5 (3 epochs at lr 5e-5, batch 32, seed 42: the quality study's
recipe; ``--dense DIR`` reads a model another run trained, otherwise it is trained once into the cache).
For each seed, CAHP's analysis of the dense model; for each degree, the heads CAHP keeps at that degree's
knee (and any ``--strategies``) are removed and the test split is scored:

- ``dense``, ``pruned`` (no recovery) and, for each reconstruction variant, ``reconstructed``;
- ``gap closed`` = (reconstructed - pruned) / (dense - pruned);
- the reconstruction's seconds, and (``--epoch F``) one recovery epoch's seconds on the same pruned model
  (cross-entropy, lr 2e-5; a fraction F of the epoch timed and scaled), the recovery it would replace;
  both as wall seconds and as this process's CPU seconds (``cpu_seconds``, ``epoch_cpu_seconds``): on one
  thread the CPU seconds are the work itself, so their ratio holds on a machine other jobs share.

Calibration: ``--calibration-rows`` training sentences drawn with the seed (the tokens are the rows).

    nice -n 10 python -m bench reconstruction --seeds 42,43,44 --degrees 2,6 --epoch 0.1
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import RESULTS, SST5, minilm_path, pin_threads, save, task_options
from cahp_engine.config import PruningConfig
from cahp_engine.data import collate, draw_subset, encode, load_splits
from cahp_engine.models import load_classifier, prune_heads, save_pruned
from cahp_engine.recovery import ReconstructionOptions, TrainingRecipe, evaluate, finetune, reconstruct
from cahp_engine.selection import analyze_heads, choose

#: name -> options of the reconstruction variants compared.
VARIANTS: dict[str, ReconstructionOptions] = {
    "ridge-residual": ReconstructionOptions(),
    "ridge-block": ReconstructionOptions(target="block"),
    "scales-residual": ReconstructionOptions(method="scales"),
    # The heads' refit, then each layer's feed-forward output projection too (its neurons are all kept).
    "ridge-residual+ffn-block": ReconstructionOptions(sublayers=("attention", "ffn")),
    "ridge-residual+ffn-residual": ReconstructionOptions(sublayers=("attention", "ffn"), ffn_target="residual"),
}


def dense_model(data: Path, cache: Path, dense_dir: Path | None, epochs: float,
                say: Any) -> tuple[Any, Any, dict[str, Any]]:
    """The dense model and tokenizer: ``dense_dir`` when given, else trained once into ``cache``."""
    directory = dense_dir or cache / f"dense-{data.name}-{epochs:g}ep"
    if not (directory / "config.json").is_file():
        if dense_dir is not None:
            raise SystemExit(f"--dense {dense_dir}: no config.json there")
        splits = load_splits(data, task_options(data))
        loaded = load_classifier(minilm_path(), num_labels=len(splits.label_names), seed=42)
        train = encode(loaded.tokenizer, splits.train, max_length=512)
        say(f"dense fine-tuning: {epochs:g} epochs at lr 5e-5 on {len(train)} rows")
        started = time.perf_counter()
        finetune(loaded.model, train, TrainingRecipe(epochs=epochs, lr=5e-5, batch_size=32, warmup_ratio=0.1,
                                                     weight_decay=0.01, max_grad_norm=1.0, seed=42, device="cpu"))
        say(f"dense model trained in {time.perf_counter() - started:.0f} s")
        save_pruned(loaded.model, loaded.tokenizer, directory)
    loaded = load_classifier(str(directory), device="cpu")
    return loaded.model.eval(), loaded.tokenizer, {"dense_dir": str(directory), "dense_epochs": epochs}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench reconstruction", description=__doc__.splitlines()[0],
                                     allow_abbrev=False)
    parser.add_argument("--data", type=Path, default=SST5,
                        help="SST-5's directory (train.csv, test.csv) or MNLI's (train.csv, validation_matched.csv: "
                             "sentence pairs)")
    parser.add_argument("--dense", type=Path, default=None, help="a densely fine-tuned model directory")
    parser.add_argument("--cache", type=Path, default=RESULTS / "cache" / "reconstruction")
    parser.add_argument("--seeds", default="42", help="comma-separated seeds (default 42)")
    parser.add_argument("--degrees", default="2,6", help="comma-separated knee degrees (default 2,6)")
    parser.add_argument("--strategies", default="cahp", help="comma-separated strategies (default cahp)")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated reconstruction variants (default all: {', '.join(VARIANTS)})")
    parser.add_argument("--calibration-rows", type=int, default=512, help="training sentences (default 512)")
    parser.add_argument("--test-rows", type=int, default=None,
                        help="test rows (default: all: SST-5's 2,210, MNLI's 9,815)")
    parser.add_argument("--dense-epochs", type=float, default=3.0, help="dense fine-tuning epochs (default 3)")
    parser.add_argument("--epoch", type=float, default=0.0, metavar="FRACTION",
                        help="also time this fraction of one recovery epoch per degree (first seed), scaled to one "
                             "epoch (default 0: not timed)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="reconstruction.json")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where --out goes (default bench/results)")
    args = parser.parse_args(argv)
    pin_threads(args.threads)
    variants = {name: VARIANTS[name] for name in args.variants.split(",") if name in VARIANTS}
    if len(variants) != len(args.variants.split(",")):
        parser.error(f"--variants must name some of {', '.join(VARIANTS)}, got {args.variants!r}")

    def say(line: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)

    dense, tokenizer, record = dense_model(args.data, args.cache, args.dense, args.dense_epochs, say)
    splits = load_splits(args.data, task_options(args.data))
    train = encode(tokenizer, splits.train, max_length=512)
    test_texts = splits.eval if args.test_rows is None else splits.eval.subset(
        draw_subset(len(splits.eval), args.test_rows, seed=0, labels=splits.eval.labels))
    test = encode(tokenizer, test_texts, max_length=512)
    dense_acc = evaluate(dense, test, batch_size=64).accuracy
    say(f"dense test accuracy {dense_acc:.4f}")
    cells: list[dict[str, Any]] = []
    for seed in (int(s) for s in args.seeds.split(",")):
        degrees = tuple(int(d) for d in args.degrees.split(","))
        config = PruningConfig(resolution=32, seed=seed, batch_size=32,
                               reported_degrees=tuple(sorted({2, 3, 4, 5, 6} | set(degrees))))
        analysis = analyze_heads(dense, train, config)
        calibration_rows = draw_subset(len(train), args.calibration_rows, seed=seed, labels=train.labels)
        order = calibration_rows[np.argsort(train.lengths[calibration_rows], kind="stable")]
        batches = [collate(train, order[i:i + 32]) for i in range(0, len(order), 32)]
        for degree in degrees:
            for strategy in args.strategies.split(","):
                selection = choose(analysis, analysis.knees[degree].k, strategy, seed=seed)
                pruned = copy.deepcopy(dense)
                prune_heads(pruned, selection.kept)
                pruned.eval()
                pruned_acc = evaluate(pruned, test, batch_size=64).accuracy
                cell: dict[str, Any] = {"seed": seed, "degree": degree, "strategy": strategy,
                                        "heads_kept": selection.num_kept, "dense": dense_acc, "pruned": pruned_acc,
                                        "variants": {}}
                for name, options in variants.items():
                    model = copy.deepcopy(pruned)
                    cpu = time.process_time()
                    result = reconstruct(dense, model, batches, options, seed=seed)
                    cpu = time.process_time() - cpu
                    acc = evaluate(model, test, batch_size=64).accuracy
                    gap = dense_acc - pruned_acc
                    cell["variants"][name] = {
                        "accuracy": acc, "gap_closed": (acc - pruned_acc) / gap if gap > 0 else None,
                        "seconds": result.seconds, "cpu_seconds": cpu, "rows": result.rows,
                        "ill_conditioned": len(result.ill_conditioned),
                        "error_before": [f.error_before for f in result.fits],
                        "error_after": [f.error_after for f in result.fits]}
                    say(f"seed {seed} degree {degree} {strategy} ({selection.num_kept} heads): dense {dense_acc:.4f} "
                        f"pruned {pruned_acc:.4f} {name} {acc:.4f} in {result.seconds:.1f} s ({cpu:.1f} CPU s)")
                if args.epoch > 0 and seed == int(args.seeds.split(",")[0]):
                    model = copy.deepcopy(pruned)
                    started, cpu = time.perf_counter(), time.process_time()
                    finetune(model, train, TrainingRecipe(
                        epochs=args.epoch, lr=2e-5, batch_size=32, warmup_ratio=0.1, weight_decay=0.01,
                        max_grad_norm=1.0, seed=seed, device="cpu"))
                    cell["epoch_seconds"] = (time.perf_counter() - started) / args.epoch
                    cell["epoch_cpu_seconds"] = (time.process_time() - cpu) / args.epoch
                    cell["epoch_fraction_timed"] = args.epoch
                    say(f"one recovery epoch: {cell['epoch_seconds']:.0f} s, {cell['epoch_cpu_seconds']:.0f} CPU s "
                        f"(from {args.epoch:g} of one)")
                cells.append(cell)
                save(args.out, {"cells": cells, **record}, command="python -m bench reconstruction "
                     + " ".join(sys.argv[1:] if argv is None else argv), protocol=__doc__ or "",
                     results=args.results)
    say(f"saved {args.results / args.out}")


if __name__ == "__main__":
    main()
