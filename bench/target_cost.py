"""What a run's target stage costs, in CPU seconds, against one recovery epoch of the same model and data.

The stage of a run with ``target_speedup`` (``cahp_engine.run._target_stage``) is timed piece by piece,
with the run's own arguments: the calibration batches, the unit importance (one Fisher pass; none when
the run's head analysis already carries it), the latency table measured on this machine (the first time,
into an empty cache) and read back from its cache (every later run), then the allocation, the surgery and
the timing of dense against pruned with its corrections. Against it: one recovery epoch (fine-tuning with
distillation, the run's default recipe) of the model a knee run recovers, all-MiniLM-L6-v2 with half of
each layer's heads (CAHP's knee keeps about half on SST-5), over ``--epoch-rows`` training sentences,
scaled to the whole training split (an epoch's cost is linear in its rows).

A knee run recovers for 3 epochs, and does more besides (the head analysis, the evaluations), so the
stage's share of a knee run is at most ``stage / (3 x epoch)``; ``share_of_knee_run_at_most`` is that
bound. The cost does not depend on trained weights: the encoder is the pretrained all-MiniLM-L6-v2 with a
fresh 5-class head. CPU seconds are ``time.process_time()`` of this one-thread process, so other work on a
shared machine does not count (its cache pressure still does).

Run: ``OMP_NUM_THREADS=1 nice -n 10 python -m bench target_cost [--target 2.0] [--epoch-rows 1024]
[--data DIR] [--model DIR]``
"""

from __future__ import annotations

import argparse
import copy
import tempfile
import time
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from bench.common import SST5, minilm_path, pin_threads, save
from cahp_engine.allocation import latency_costs, prune_to_target, unit_importance
from cahp_engine.config import PruningConfig
from cahp_engine.data import DatasetOptions, draw_subset, encode, load_splits, take_rows
from cahp_engine.models import load_classifier, prune_heads
from cahp_engine.recovery import Distillation, TrainingRecipe, finetune, teacher_logits
from cahp_engine.run._reconstruct import calibration_batches
from cahp_engine.run._target_stage import TARGET_REPEATS

T = TypeVar("T")


def cpu(fn: Callable[[], T]) -> tuple[T, float]:
    """``fn()`` and the CPU seconds it took (this process, all its threads)."""
    start = time.process_time()
    value = fn()
    return value, time.process_time() - start


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench target_cost")
    p.add_argument("--target", type=float, default=2.0, help="target_speedup (PyTorch fp32, batch 32 x 64 tokens)")
    p.add_argument("--epoch-rows", type=int, default=1024, help="training sentences the epoch is timed on")
    p.add_argument("--data", default=str(SST5))
    p.add_argument("--model", default=None, help="a model directory (default: all-MiniLM-L6-v2, fresh head)")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    pin_threads(args.threads)
    config = PruningConfig(target_speedup=args.target, target_batch=32, target_seq_len=64)
    splits = load_splits(args.data, DatasetOptions(eval_split="test"))
    loaded = load_classifier(args.model or minilm_path(), num_labels=len(splits.label_names))
    model, tokenizer = loaded.model.eval(), loaded.tokenizer
    train = encode(tokenizer, splits.train, max_length=config.max_length)
    figures: dict[str, Any] = {}

    batches, figures["calibration_batches_s"] = cpu(lambda: calibration_batches(train, config))
    scores, figures["importance_s"] = cpu(lambda: unit_importance(model, batches))
    with tempfile.TemporaryDirectory(prefix="cahp-latency-bench-") as cache:
        shape = {"batch_size": config.target_batch, "seq_len": config.target_seq_len,
                 "repeats": max(1, min(TARGET_REPEATS, config.latency_repeats)), "cache_dir": cache}
        table, figures["latency_table_first_s"] = cpu(lambda: latency_costs(model, **shape))
        figures["latency_table_fit_error"] = table.fit_error
        _, figures["latency_table_cached_s"] = cpu(lambda: latency_costs(model, **shape))
        (pruned, result), figures["allocate_cut_time_s"] = cpu(lambda: prune_to_target(
            model, batches, target_speedup=args.target, importance=scores, **shape))
    figures["corrections"] = result.corrections
    figures["measured_speedup"] = result.measured_speedup
    cached = figures["calibration_batches_s"] + figures["importance_s"] + figures["latency_table_cached_s"] \
        + figures["allocate_cut_time_s"]
    figures["stage_cached_s"] = cached
    figures["stage_first_s"] = cached - figures["latency_table_cached_s"] + figures["latency_table_first_s"]

    knee_like = copy.deepcopy(model)
    heads = int(model.config.num_attention_heads)
    prune_heads(knee_like, {layer: list(range(heads // 2)) for layer in range(int(model.config.num_hidden_layers))})
    rows = min(args.epoch_rows, len(train))
    subset = take_rows(train, draw_subset(len(train), rows, seed=0, labels=np.asarray(train.labels)))
    teacher = teacher_logits(model, subset, batch_size=config.batch_size)
    _, part = cpu(lambda: finetune(knee_like, subset, TrainingRecipe(
        epochs=1, lr=config.lr, batch_size=config.batch_size, warmup_ratio=config.warmup_ratio,
        weight_decay=config.weight_decay, max_grad_norm=config.max_grad_norm, seed=config.seed,
        distillation=Distillation(teacher, config.distill_alpha, config.distill_temperature))))
    epoch = part * len(train) / rows
    figures.update(epoch_rows_timed=rows, epoch_part_s=part, recovery_epoch_s=epoch, train_rows=len(train))
    for which in ("cached", "first"):
        stage = figures[f"stage_{which}_s"]
        figures[f"stage_{which}_per_epoch"] = stage / epoch
        figures[f"share_of_knee_run_at_most_{which}"] = stage / (config.epochs * epoch)
    for name, value in figures.items():
        print(f"{name}: {value:.3f}" if isinstance(value, float) else f"{name}: {value}", flush=True)
    path = save("target_cost.json", {"target_speedup": args.target, **figures},
                command="OMP_NUM_THREADS=1 nice -n 10 python -m bench target_cost " + " ".join(argv or []),
                protocol=f"CPU seconds (time.process_time), {args.threads} torch thread(s); the target stage with "
                f"the run's arguments (PyTorch fp32, batch 32 x 64 tokens, {config.reconstruction_rows} "
                "calibration rows); one recovery epoch (distillation, the run's recipe) of the model with 6 of "
                f"12 heads per layer timed on {rows} SST-5 training sentences and scaled to {len(train)}; the "
                f"share of a knee run is at most stage / ({config.epochs:g} x epoch)")
    print(f"saved {path}")


if __name__ == "__main__":
    main()
