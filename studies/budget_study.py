"""The accuracy budget and the recovery that keeps its best, measured on SST-5 (and on a rare-class copy of it).

Everything starts from the quality study's dense all-MiniLM-L6-v2 (``studies/quality.py``: trained once
on the pinned CPU path, cached under its cache, retrained and checked against the cached record where the
weights are missing) and its cached CAHP selections. Three parts (``--parts``):

* ``early-stopping``: CAHP's heads of each seed and degree recovered once (distillation, the engine's
  default) over the paper's 3 epochs, judged on SST-5's own validation split after every epoch and never
  stopped, the test split scored at every epoch too; from that one run, what each recovery of
  :data:`RECOVERIES` returns (``fixed``: the paper's, last weights; ``best-of-3``; ``patience1``,
  ``patience2``), since an early-stopped fine-tuning is the never-stopped one's prefix (checked by
  tests/engine/recovery/test_early_stopping.py). Test accuracy, macro-F1 and recovery seconds. What decides the
  default of ``early_stopping_patience``.
* ``reconstructed-start``: the same protocol, each recovery starting from the pruned model after a
  layer-wise reconstruction instead of from the pruned weights; test accuracy after every epoch, read
  against ``early-stopping``'s: what decides the default of ``recovery``. This part refits the attention
  alone (the run's reconstruction when it was recorded); ``reconstructed-start-ffn`` does the same from
  the run's reconstruction today (the feed-forward blocks refit too, ``RUN_RECONSTRUCTION``).
* ``budget``: whole runs (``run_pruning``, what ``cahp prune`` runs) on the dense model: one at the knee
  with the same recovery, then accuracy budgets of 1.0, 2.0 and 0.5 points of accuracy and 1.0 point
  of macro-F1, both strategies searched; heads kept, test accuracy against dense, and the wall time
  against the knee run's.
* ``imbalanced``: SST-5 with its *very negative* class cut to 1.6 % of the training rows (a seeded draw;
  validation and test untouched), a dense model fine-tuned on it as the quality study's is, then runs at
  the knees of degrees 2 and 6 and a macro-F1 budget of 1 point, each without and with class-balanced
  recovery (``class_weight`` balanced); per-class test recall and the lost-class warnings. The rare-class
  dense model's test scores are recorded; one retrained in a later session must score the same. No other
  imbalanced public dataset is reachable offline, hence the copy of SST-5.

Every finished cell, and every finished run's report.json, goes at once to the record directory
(default studies/results/budget_sst5/, tracked by git, so that the study spans sessions); models and
run directories go to the cache (default studies/results/cache/budget_sst5/, not tracked). A killed
study resumes after its last finished cell or run (a run killed half-way starts again); two processes
can share the early-stopping part. The figures go to studies/results/budget_sst5.json and .md.

Run: ``python -m studies budget [--parts early-stopping,budget,imbalanced] [--seeds 42,43,44]
[--degrees 2,6] [--threads 1] [--report-only]``
"""

from __future__ import annotations

import argparse
import copy
import csv
import dataclasses
import json
import os
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from cahp_engine.config import PruningConfig
from cahp_engine.data import DatasetOptions, EncodedDataset, encode, load_splits
from cahp_engine.errors import AccuracyBudgetError
from cahp_engine.models import heads_per_layer, load_classifier, prune_heads, save_pruned
from cahp_engine.recovery import (
    BestWeights,
    Distillation,
    FineTuning,
    ReconstructionOptions,
    TrainingRecipe,
    ValidationWatch,
    evaluate,
    finetune,
)
from cahp_engine.results import ValidationPoint
from cahp_engine.run import RunHooks, RunRequest, run_pruning
from cahp_engine.run._holdout import ValidationScorer
from studies import common, quality

PARTS = ("early-stopping", "reconstructed-start", "reconstructed-start-ffn", "budget", "imbalanced")
#: The reconstructed-start parts: their record and the refit each starts from (None: the run's own).
STARTS: dict[str, tuple[str, ReconstructionOptions | None]] = {
    "reconstructed-start": ("reconstructed-start.json", ReconstructionOptions()),
    "reconstructed-start-ffn": ("reconstructed-start-ffn.json", None)}
#: Early stopping's settings compared (patience 0 is the paper's fixed epochs).
PATIENCES = (0, 1, 2)
#: The budget runs: name -> the settings that differ from the knee run's.
def _whole_jobs(seeds: Any, suffix: str = "", **settings: Any) -> dict[str, dict[str, Any]]:
    """Per seed, reconstruction alone, reconstruction then the knee run's epochs, and the knee run again beside them
    (the same load): ``reconstruct-ffn``, ``reconstruct+finetune-ffn``, ``knee-beside-ffn``, then ``suffix``, then
    ``-seedN`` for every seed but 42."""
    modes = (("reconstruct-ffn", "reconstruct"), ("reconstruct+finetune-ffn", "reconstruct+finetune"),
             ("knee-beside-ffn", "finetune"))
    return {name + suffix + ("" if seed == 42 else f"-seed{seed}"): {"recovery": mode, "seed": seed, **settings}
            for seed in seeds for name, mode in modes}


BUDGET_RUNS: dict[str, dict[str, Any]] = {
    "knee": {},
    "p1.0": {"max_accuracy_drop": 1.0},
    "p2.0": {"max_accuracy_drop": 2.0},
    "p0.5": {"max_accuracy_drop": 0.5},
    "p1.0-macro-f1": {"max_accuracy_drop": 1.0, "budget_metric": "macro_f1"},
    # Recovery by layer-wise reconstruction: alone, before one epoch of fine-tuning or the knee run's (equal
    # time), and the budget judged after it (candidates bisected per strategy on their reconstructed score; only
    # the chosen one, and a close runner-up, fine-tuned).
    "reconstruct": {"recovery": "reconstruct"},
    "reconstruct+finetune-1ep": {"recovery": "reconstruct+finetune", "epochs": 1.0},
    "reconstruct+finetune": {"recovery": "reconstruct+finetune"},  # the knee run's epochs: equal time
    "p1.0-judged": {"max_accuracy_drop": 1.0, "recovery": "reconstruct+finetune",
                    "budget_strategies": ("cahp", "salience", "cahp-layer-salience")},
    "p2.0-judged": {"max_accuracy_drop": 2.0, "recovery": "reconstruct+finetune",
                    "budget_strategies": ("cahp", "salience", "cahp-layer-salience")},
    "p0.5-judged": {"max_accuracy_drop": 0.5, "recovery": "reconstruct+finetune",
                    "budget_strategies": ("cahp", "salience", "cahp-layer-salience")},
    # The judged search with the default recovery: scored after reconstruction, the knee probed first, every
    # fine-tuning from the pruned weights as the knee run's.
    "p1.0-judged-finetune": {"max_accuracy_drop": 1.0, "budget_search": "judged",
                             "budget_strategies": ("cahp", "salience", "cahp-layer-salience")},
    "p2.0-judged-finetune": {"max_accuracy_drop": 2.0, "budget_search": "judged",
                             "budget_strategies": ("cahp", "salience", "cahp-layer-salience")},
    "p0.5-judged-finetune": {"max_accuracy_drop": 0.5, "budget_search": "judged",
                             "budget_strategies": ("cahp", "salience", "cahp-layer-salience")},
    "p1.0-reconstruct": {"max_accuracy_drop": 1.0, "recovery": "reconstruct",
                         "budget_strategies": ("cahp", "salience", "cahp-layer-salience")},
    # p1.0-reconstruct's, p1.0-judged's and p1.0-fastest-reconstruct's settings again, once a run's
    # reconstruction refit each layer's feed-forward output projection after its attention's against the sum with
    # its residual (their records: the attention refit alone, and the block target where neurons were cut).
    "p1.0-reconstruct-ffn": {"max_accuracy_drop": 1.0, "recovery": "reconstruct",
                             "budget_strategies": ("cahp", "salience", "cahp-layer-salience")},
    "p1.0-judged-ffn": {"max_accuracy_drop": 1.0, "recovery": "reconstruct+finetune",
                        "budget_strategies": ("cahp", "salience", "cahp-layer-salience")},
    "p1.0-fastest-reconstruct-ffn": {"max_accuracy_drop": 1.0, "budget_objective": "speed",
                                     "recovery": "reconstruct", "target_runtime": "pytorch", "target_batch": 32,
                                     "target_seq_len": 64},
    # The budget judged after that reconstruction alone at the other two budgets, and at P = 1.0 on two more seeds
    # (the seed draws the calibration rows and the selection's t-SNE embedding).
    "p2.0-reconstruct-ffn": {"max_accuracy_drop": 2.0, "recovery": "reconstruct",
                             "budget_strategies": ("cahp", "salience", "cahp-layer-salience")},
    "p0.5-reconstruct-ffn": {"max_accuracy_drop": 0.5, "recovery": "reconstruct",
                             "budget_strategies": ("cahp", "salience", "cahp-layer-salience")},
    "p1.0-reconstruct-ffn-seed43": {"max_accuracy_drop": 1.0, "recovery": "reconstruct", "seed": 43,
                                    "budget_strategies": ("cahp", "salience", "cahp-layer-salience")},
    "p1.0-reconstruct-ffn-seed44": {"max_accuracy_drop": 1.0, "recovery": "reconstruct", "seed": 44,
                                    "budget_strategies": ("cahp", "salience", "cahp-layer-salience")},
    # The fastest model within the budget: a bisection over speed targets (PyTorch fp32, batch 32, 64 tokens),
    # heads and feed-forward neurons cut, judged after reconstruction; the chosen one fine-tuned, or not.
    "p1.0-fastest": {"max_accuracy_drop": 1.0, "budget_objective": "speed", "recovery": "reconstruct+finetune",
                     "target_runtime": "pytorch", "target_batch": 32, "target_seq_len": 64},
    "p1.0-fastest-reconstruct": {"max_accuracy_drop": 1.0, "budget_objective": "speed", "recovery": "reconstruct",
                                 "target_runtime": "pytorch", "target_batch": 32, "target_seq_len": 64},
    # p1.0-fastest's settings again, once the search probed faster targets with fine-tuning (p1.0-fastest's
    # record is the search that judged on reconstructed scores alone).
    "p1.0-fastest-probed": {"max_accuracy_drop": 1.0, "budget_objective": "speed", "recovery": "reconstruct+finetune",
                            "target_runtime": "pytorch", "target_batch": 32, "target_seq_len": 64},
    # Whole jobs once a run's reconstruction refit the feed-forward blocks too, seeds 42 to 46, and at the knee of
    # degree 6 (12-14 heads) seeds 42 and 43.
    **_whole_jobs(range(42, 47)),
    **_whole_jobs((42, 43), "-d6", poly_degree=6),
}
#: The rare-class copy: class 0 keeps this share of the training rows.
RARE_SHARE = 0.016
IMBALANCED_RUNS: dict[str, dict[str, Any]] = {
    f"{name}-{weight}": {**settings, "class_weight": weight}
    for name, settings in (("d2", {"poly_degree": 2}), ("d6", {"poly_degree": 6}),
                           ("p1.0-macro-f1", {"max_accuracy_drop": 1.0, "budget_metric": "macro_f1"}))
    for weight in ("none", "balanced")
}


@dataclasses.dataclass(frozen=True)
class Setup:
    """What the study runs on: the quality study's protocol (dense recipe, seeds, degrees) and the inputs."""

    protocol: quality.Protocol
    base: str
    data_dir: Path
    quality_cache: Path
    cache: Path  # models and run directories (not tracked)
    record: Path  # every finished cell and run's report.json (tracked: a study spans sessions)
    patience: int = 1  # the budget and imbalanced runs' early stopping
    epochs: float = 3.0
    lr: float = 2e-5
    device: torch.device = torch.device("cpu")
    run_overrides: dict[str, Any] = dataclasses.field(default_factory=dict)  # the smoke test's tiny runs
    only: tuple[str, ...] = ()  # the whole runs this process computes (empty: all; the others are read if recorded)


def _read(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


def _store(path: Path, key: str, value: Any) -> dict[str, Any]:
    return quality.store_cell(path, key, value)


# --------------------------------------------------------------------------- early stopping

#: The recoveries compared, derived from one run per (seed, degree): name -> (patience, keeps the best).
RECOVERIES: dict[str, tuple[int, bool]] = {"fixed": (0, False), "best-of-3": (0, True),
                                           **{f"patience{p}": (p, True) for p in PATIENCES if p > 0}}


class _TimedScorer:
    """A :class:`ValidationScorer` that adds up the seconds it spends (validation is part of a recovery's cost)."""

    def __init__(self, scorer: ValidationScorer) -> None:
        self.scorer, self.seconds = scorer, 0.0

    def __call__(self, model: nn.Module, step: int, epoch: float) -> ValidationPoint:
        start = time.perf_counter()
        try:
            return self.scorer(model, step, epoch)
        finally:
            self.seconds += time.perf_counter() - start


def recover_curve(dense: nn.Module, train: EncodedDataset, validation: EncodedDataset, test: EncodedDataset,
                  heads: list[list[int]], *, seed: int, setup: Setup, teacher: Any,
                  start: str | None = None) -> dict[str, Any]:
    """CAHP's heads recovered once over the whole schedule, judged on validation after every epoch and
    never stopped; the test split scored at every evaluation too (outside the timed span, and never
    seen by the recovery). Each stop's training and validation seconds are recorded apart. With
    ``start`` (a part of :data:`STARTS`), the pruned model is first reconstructed as a
    ``reconstruct+finetune`` run does (the run's own calibration rows for the seed, that part's options),
    and its seconds recorded."""
    pruned = copy.deepcopy(dense)
    kept: dict[int, list[int]] = {layer: [] for layer in range(len(heads_per_layer(dense)))}
    for layer, head in heads:
        kept[layer].append(head)
    prune_heads(pruned, kept)
    reconstruction: dict[str, Any] | None = None
    if start:
        reconstruction = quality.reconstruct_as_a_run(dense, pruned, train, seed, setup.device, STARTS[start][1])
    scorer = _TimedScorer(ValidationScorer(validation, "accuracy", evaluate(dense, validation, device=setup.device),
                                           32, setup.device))
    recipe = TrainingRecipe(epochs=setup.epochs, lr=setup.lr, batch_size=32, warmup_ratio=0.1, weight_decay=0.01,
                            max_grad_norm=1.0, seed=seed, device=setup.device,
                            distillation=None if teacher is None else Distillation(teacher))
    tuning = FineTuning(pruned, train, recipe, watch=ValidationWatch(scorer, early_stopping_patience=0))
    stops: list[dict[str, Any]] = []
    while not tuning.done:
        trained, validated = tuning.result().wall_s, scorer.seconds
        point = tuning.advance()
        assert point is not None
        scored = evaluate(pruned, test, batch_size=32, device=setup.device)
        stops.append({"point": point.to_dict(), "train_s": tuning.result().wall_s - trained,
                      "validation_s": scorer.seconds - validated,
                      "test": {"accuracy": scored.accuracy, "macro_f1": scored.macro_f1,
                               "recall": list(scored.recall)}})
    result = tuning.finish()
    return {"heads_kept": len(heads), "stops": stops, "steps": result.steps,
            "loss_per_epoch": list(result.loss_per_epoch), "reconstruction": reconstruction}


def derive(stops: list[dict[str, Any]], total_steps: int, patience: int, keep_best: bool) -> dict[str, Any]:
    """What a recovery with ``patience`` (and keeping its best, or its last weights) returns, read off one
    run that was never stopped: early stopping ends a fine-tuning on its schedule's path (the schedule is
    planned for the whole epochs either way and validation draws nothing from the training's random
    state), so a stopped run is this run's prefix. The rule is the engine's own :class:`BestWeights`."""
    if not keep_best:  # the paper's recovery: no validation split read, the last weights
        last = stops[-1]
        return {"test": last["test"], "epochs": last["point"]["epoch"], "best_epoch": None, "stopped_early": False,
                "recovery_s": sum(s["train_s"] for s in stops)}
    best = BestWeights(patience)
    nothing = nn.Identity()
    end = len(stops)
    for i, stop in enumerate(stops):
        point = ValidationPoint.from_dict(stop["point"])
        best.observe(nothing, point)
        if best.exhausted and point.step < total_steps:
            end = i + 1
            break
    assert best.best is not None
    chosen = stops[best.best]
    return {"test": chosen["test"], "epochs": stops[end - 1]["point"]["epoch"], "best_epoch": chosen["point"]["epoch"],
            "stopped_early": end < len(stops),
            "recovery_s": sum(s["train_s"] + s["validation_s"] for s in stops[:end])}


def early_stopping(setup: Setup, compute: bool, say: Callable[[str], None], *,
                   start: str | None = None) -> dict[str, Any]:
    """The ``early-stopping`` part (or, with ``start``, that part of :data:`STARTS`): one never-stopped
    recovery per (seed, degree), resumable; every recovery of :data:`RECOVERIES` derived from it."""
    path = setup.record / (STARTS[start][0] if start else "early-stopping.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    cells: dict[str, Any] = _read(path) or {}
    todo = [(s, d) for s in setup.protocol.seeds for d in setup.protocol.degrees]
    pending = [t for t in todo if _es_key(*t) not in cells]
    if compute and pending:
        dense, tokenizer, _ = quality.dense_model(setup.base, setup.data_dir, setup.quality_cache, setup.protocol,
                                                  setup.device, say)
        train, test = quality.load_data(setup.data_dir, tokenizer, setup.protocol)
        validation = _validation(setup, tokenizer)
        teacher = quality.teacher_for(dense, train, setup.quality_cache, setup.protocol, setup.device, say)
        for seed, degree in pending:
            if _es_key(seed, degree) in (_read(path) or {}):
                continue  # another process of the study took it
            heads = _selection(setup, dense, train, seed)["degrees"][str(degree)]["kept"]["cahp"]
            t0 = time.perf_counter()
            cell = recover_curve(dense, train, validation, test, heads, seed=seed, setup=setup, teacher=teacher,
                                 start=start)
            cell.update(seed=seed, degree=degree, wall_s=time.perf_counter() - t0)
            cells = _store(path, _es_key(seed, degree), cell)
            say(f"seed {seed} degree {degree}: {len(heads)} heads, test by epoch "
                + ", ".join(f"{s['test']['accuracy']:.4f}" for s in cell["stops"]) + f" ({cell['wall_s']:.0f} s)")
    rows: list[dict[str, Any]] = []
    for key in (_es_key(*t) for t in todo):
        if key not in cells:
            continue
        cell = cells[key]
        for name, (patience, keep_best) in RECOVERIES.items():
            rows.append({"seed": cell["seed"], "degree": cell["degree"], "recovery": name,
                         "heads_kept": cell["heads_kept"], **derive(cell["stops"], cell["steps"], patience, keep_best)})
    summary: dict[str, Any] = {}
    for degree in setup.protocol.degrees:
        for name in RECOVERIES:
            mine = [r for r in rows if r["degree"] == degree and r["recovery"] == name]
            if mine:
                summary.setdefault(str(degree), {})[name] = {
                    "seeds": [r["seed"] for r in mine],
                    "accuracy_mean": statistics.fmean(r["test"]["accuracy"] for r in mine),
                    "macro_f1_mean": statistics.fmean(r["test"]["macro_f1"] for r in mine),
                    "recovery_s_mean": statistics.fmean(r["recovery_s"] for r in mine),
                    "epochs_mean": statistics.fmean(r["epochs"] for r in mine),
                    "stopped_early": sum(r["stopped_early"] for r in mine)}
    return {"cells": [cells[k] for t in todo if (k := _es_key(*t)) in cells], "recoveries": rows,
            "summary": summary, "complete": not [t for t in todo if _es_key(*t) not in cells]}


def _es_key(seed: int, degree: int) -> str:
    return f"seed={seed}/degree={degree}/never-stopped"


def _selection(setup: Setup, dense: nn.Module, train: EncodedDataset, seed: int) -> dict[str, Any]:
    """The quality study's cached selection of ``seed`` (made and cached here when missing)."""
    path = setup.quality_cache / f"selection-seed{seed}.json"
    found = _read(path)
    if found is None or any(str(d) not in found["degrees"] for d in setup.protocol.degrees):
        found = quality.selections_for_seed(dense, train, setup.protocol, seed)
        quality._write_json(path, found)
    return dict(found)


def _validation(setup: Setup, tokenizer: Any) -> EncodedDataset:
    splits = load_splits(setup.data_dir, DatasetOptions(eval_split="validation"))
    return encode(tokenizer, splits.eval, max_length=512)


# --------------------------------------------------------------------------- whole runs


def whole_runs(setup: Setup, runs: dict[str, dict[str, Any]], *, model: Path, data: Path, folder: str,
               compute: bool, say: Callable[[str], None]) -> dict[str, Any]:
    """Each of ``runs`` through ``run_pruning`` into ``cache/<folder>/<name>``; a finished run is kept."""
    out: dict[str, Any] = {}
    for name, changes in runs.items():
        directory, recorded = setup.cache / folder / name, _recorded(setup, folder, name)
        report = _read(recorded)
        if report is None and compute and _ours(setup, name):
            # `recovery` finetune, the paper's and the default when the first runs were recorded: a run that
            # recovers otherwise names its mode.
            config = PruningConfig(**{"dense_finetune": "never", "export": "none", "seed": 42, "epochs": setup.epochs,
                                      "lr": setup.lr, "early_stopping_patience": setup.patience,
                                      "recovery": "finetune", "device": setup.device.type, **setup.run_overrides,
                                      **changes})
            say(f"{folder}/{name}: {changes or 'the knee'}")
            t0, cpu0 = time.perf_counter(), time.process_time()
            try:
                run_pruning(RunRequest(model_ref=str(model), dataset_ref=str(data), output_dir=directory,
                                       config=config, dataset_options=DatasetOptions(eval_split="test"),
                                       overwrite=True),
                            RunHooks(log=_prefixed(say, name)))
            except AccuracyBudgetError as exc:
                say(f"  [{name}] {exc}")
            report = _read(directory / "report.json")
            if report is not None:
                # The process's CPU seconds (every thread) and the machine's load: wall seconds of runs recorded
                # under different loads do not compare, CPU seconds of one-thread runs nearly do.
                report["study"] = {"cpu_s": time.process_time() - cpu0, "load_average": list(os.getloadavg()),
                                   "torch_threads": torch.get_num_threads()}
                quality._write_json(recorded, report)
            say(f"{folder}/{name}: done in {time.perf_counter() - t0:.0f} s")
        if report is not None:
            out[name] = _run_summary(report)
    knee = out.get("knee") or out.get("d2-none")
    for row in out.values():
        row["wall_vs_knee"] = None if not knee else row["wall_time_s"] / knee["wall_time_s"]
    return out


def _recorded(setup: Setup, folder: str, name: str) -> Path:
    """Where a finished whole run's report.json is kept."""
    return setup.record / folder / f"{name}.json"


def _ours(setup: Setup, name: str) -> bool:
    """Whether this process computes the whole run ``name`` (``--runs``)."""
    return not setup.only or name in setup.only


def _prefixed(say: Callable[[str], None], name: str) -> Callable[[str], None]:
    return lambda line: say(f"  [{name}] {line}")


def _run_summary(report: dict[str, Any]) -> dict[str, Any]:
    """What the tables need of one report.json (a failed budget's too)."""
    budget = report.get("budget")
    metrics = report["metrics"]
    pruned = metrics.get("pruned")
    return {
        "status": report.get("status", "succeeded"),
        "heads_kept": None if pruned is None else report["summary"]["heads_kept"],
        "dense_accuracy": metrics["dense"]["accuracy"],
        "accuracy": None if pruned is None else pruned["accuracy"],
        "macro_f1": None if pruned is None else pruned["macro_f1"],
        "recall": None if pruned is None else pruned["recall"],
        "dense_recall": metrics["dense"]["recall"],
        "wall_time_s": report.get("wall_time_s") or sum(report["timings_s"].values()),
        "cpu_s": (report.get("study") or {}).get("cpu_s"),
        "timings_s": report["timings_s"],
        "recovery_epochs": None if pruned is None else report["recovery"]["epochs"],
        "warnings": report["warnings"],
        "budget": None if budget is None else {
            k: budget[k] for k in ("chosen", "chosen_strategy", "strategy_margin", "noise_half_width",
                                   "epochs_trained", "cost_vs_single_run", "ladder", "threshold", "dense_validation")}
        | {"candidates": [{**{k: c[k] for k in ("round", "strategy", "heads_kept", "epochs", "stopped", "drop")},
                           "reconstructed": c.get("reconstructed")} for c in budget["candidates"]],
                             "skipped": len(budget.get("skipped") or ()),
                             "chosen_target": budget.get("chosen_target"),
                             "targets_tried": [c.get("target_speedup") for c in budget["candidates"]
                                               if c.get("target_speedup") is not None]},
        "target": None if report.get("target") is None else {
            k: report["target"][k] for k in ("target", "measured_speedup", "predicted_speedup", "heads_per_layer",
                                             "neurons_per_layer")},
        "reconstruction_s": (report.get("reconstruction") or {}).get("seconds"),
    }


# --------------------------------------------------------------------------- the rare-class copy


def rare_class_copy(data_dir: Path, target: Path, *, share: float = RARE_SHARE, seed: int = 0) -> Path:
    """SST-5 with class 0 cut to ``share`` of the training rows (a seeded draw); other splits copied as read."""
    target.mkdir(parents=True, exist_ok=True)
    for split in ("validation", "test"):
        (target / f"{split}.csv").write_text((data_dir / f"{split}.csv").read_text())
    with (data_dir / "train.csv").open(newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader)
        rows = list(reader)
    label = header.index("label")
    rare = [r for r in rows if r[label] == "0"]
    rest = [r for r in rows if r[label] != "0"]
    keep = int(round(share * len(rest) / (1.0 - share)))
    picked = np.random.default_rng(seed).choice(len(rare), size=min(keep, len(rare)), replace=False)
    chosen = rest + [rare[i] for i in sorted(picked)]
    with (target / "train.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(chosen)
    return target


def rare_class_dense(setup: Setup, data: Path, say: Callable[[str], None]) -> Path:
    """A dense model fine-tuned on the rare-class copy with the quality study's dense recipe (cached).

    Its test scores go to the record; a later session that must retrain it (the weights are not tracked)
    goes on only when the retrained model scores the same test confusion matrix, so that the recorded
    runs and the new ones prune the same model.
    """
    directory, recorded = setup.cache / "imbalanced" / "dense", setup.record / "imbalanced" / "dense.json"
    if (directory / "config.json").is_file():
        return directory
    loaded = load_classifier(setup.base, num_labels=5, seed=setup.protocol.dense_seed)
    train, test = quality.load_data(data, loaded.tokenizer, setup.protocol)
    say(f"rare-class dense fine-tuning on {len(train)} rows ({int((train.labels == 0).sum())} of class 0)")
    training = finetune(loaded.model, train, TrainingRecipe(
        epochs=setup.protocol.dense_epochs, lr=setup.protocol.dense_lr, batch_size=setup.protocol.batch_size,
        warmup_ratio=0.1, weight_decay=0.01, max_grad_norm=1.0, seed=setup.protocol.dense_seed, device=setup.device))
    scored = evaluate(loaded.model, test, batch_size=setup.protocol.batch_size, device=setup.device).to_dict()
    record = _read(recorded)
    if record is not None and record["test"]["confusion"] != scored["confusion"]:
        raise SystemExit(
            f"the rare-class dense model retrained here (test accuracy {scored['accuracy']:.4f}) is not the one "
            f"the recorded imbalanced runs pruned ({record['test']['accuracy']:.4f}, trained on "
            f"{record['trained_on']}); run on that machine type and thread count, or move {recorded.parent} aside")
    save_pruned(loaded.model, loaded.tokenizer, directory)
    if record is None:
        machine = common.machine()
        quality._write_json(recorded, {"test": scored, "training": training.to_dict(),
                                       "trained_on": {k: machine[k] for k in ("cpu", "vector_isa", "torch_threads")}})
    return directory


# --------------------------------------------------------------------------- the study


def run(setup: Setup, parts: tuple[str, ...], *, compute: bool, say: Callable[[str], None]) -> dict[str, Any]:
    """Every part of ``parts`` (or, with ``compute=False``, what the cache holds); the payload."""
    setup.cache.mkdir(parents=True, exist_ok=True)
    payload: dict[str, Any] = {"settings": {"parts": list(parts), "seeds": list(setup.protocol.seeds),
                                            "degrees": list(setup.protocol.degrees), "recoveries": list(RECOVERIES),
                                            "runs_patience": setup.patience, "epochs": setup.epochs,
                                            "lr": setup.lr}}
    if "early-stopping" in parts:
        payload["early_stopping"] = early_stopping(setup, compute, say)
    for part in STARTS:
        if part in parts:
            payload[part.replace("-", "_")] = early_stopping(setup, compute, say, start=part)
    if "budget" in parts:
        if compute:
            quality.dense_model(setup.base, setup.data_dir, setup.quality_cache, setup.protocol, setup.device, say)
        payload["budget"] = whole_runs(setup, BUDGET_RUNS, model=setup.quality_cache / "dense", data=setup.data_dir,
                                       folder="budget", compute=compute, say=say)
    if "imbalanced" in parts:
        data = rare_class_copy(setup.data_dir, setup.cache / "imbalanced" / "data")
        wanted = [name for name in IMBALANCED_RUNS
                  if _ours(setup, name) and not _recorded(setup, "imbalanced", name).is_file()]
        model = rare_class_dense(setup, data, say) if compute and wanted else setup.cache / "imbalanced" / "dense"
        payload["imbalanced"] = whole_runs(setup, IMBALANCED_RUNS, model=model, data=data, folder="imbalanced",
                                           compute=compute, say=say)
    payload["dense"] = _read(setup.quality_cache / "dense.json")
    return payload


def markdown(doc: dict[str, Any]) -> str:
    """The tables docs/performance.md takes its figures from."""
    lines = [f"# SST-5: the accuracy budget and early stopping\n\nDate {doc['date']}; command `{doc['command']}`.", ""]
    es = doc.get("early_stopping")
    if es:
        lines += ["## Early stopping against the paper's fixed 3 epochs (CAHP's heads, distillation)", "",
                  "One recovery per seed and degree, judged on validation after every epoch and never stopped; "
                  "each row is what that recovery would have returned (`fixed`: the last weights, no validation "
                  "read; `best-of-3`: the best epoch's; `patienceN`: stopped after N epochs without gain, the "
                  "best epoch's weights). Recovery seconds: training, plus validation where it is read.", "",
                  "| degree | recovery | seeds | test accuracy | macro-F1 | epochs trained | stopped early | "
                  "recovery s |", "|---|---|---|---|---|---|---|---|"]
        for degree, rows in es["summary"].items():
            for name, r in rows.items():
                lines.append(f"| {degree} | {name} | {len(r['seeds'])} | {100 * r['accuracy_mean']:.2f} | "
                             f"{100 * r['macro_f1_mean']:.2f} | {r['epochs_mean']:.2f} | {r['stopped_early']} | "
                             f"{r['recovery_s_mean']:.0f} |")
        lines += ["", "| seed | degree | heads | test accuracy after epoch 0, 1, 2, 3 | "
                  "validation accuracy after 0, 1, 2, 3 |",
                  "|---|---|---|---|---|"]
        for cell in es["cells"]:
            tests = ", ".join(f"{100 * s['test']['accuracy']:.2f}" for s in cell["stops"])
            vals = ", ".join(f"{100 * s['point']['accuracy']:.2f}" for s in cell["stops"])
            lines.append(f"| {cell['seed']} | {cell['degree']} | {cell['heads_kept']} | {tests} | {vals} |")
        lines.append("")
    lines += _start_lines(doc, "reconstructed_start", "the attention refit alone")
    lines += _start_lines(doc, "reconstructed_start_ffn", "the run's reconstruction: attention and feed-forward refit")
    for part in ("budget", "imbalanced"):
        runs = doc.get(part)
        if not runs:
            continue
        lines += [f"## {part}", "", "| run | status | heads | test accuracy (dense) | macro-F1 | strategy (margin) | "
                  "epochs | wall s (x knee) | CPU s | warnings |", "|---|---|---|---|---|---|---|---|---|---|"]
        for name, r in runs.items():
            b = r["budget"] or {}
            acc = "–" if r["accuracy"] is None else f"{100 * r['accuracy']:.2f} ({100 * r['dense_accuracy']:.2f})"
            f1 = "–" if r["macro_f1"] is None else f"{100 * r['macro_f1']:.2f}"
            margin = "" if b.get("strategy_margin") is None else f" ({b['strategy_margin']:+.2f})"
            ratio = "" if r["wall_vs_knee"] is None else f" (x{r['wall_vs_knee']:.2f})"
            cpu = "–" if r.get("cpu_s") is None else f"{r['cpu_s']:.0f}"
            lines.append(f"| {name} | {r['status']} | {r['heads_kept']} | {acc} | {f1} | "
                         f"{b.get('chosen_strategy') or '–'}{margin} | "
                         f"{b.get('epochs_trained', r['recovery_epochs'])} | "
                         f"{r['wall_time_s']:.0f}{ratio} | {cpu} | {len(r['warnings'])} |")
        lines.append("")
    return "\n".join(lines)


def _start_lines(doc: dict[str, Any], key: str, refit: str) -> list[str]:
    """A reconstructed-start table (``key``): test accuracy after each epoch of the recovery that starts from the
    reconstructed model (``refit`` says which reconstruction), beside the one that starts from the pruned
    weights (``early-stopping``'s cell)."""
    rs = doc.get(key)
    if not rs or not rs["cells"]:
        return []
    pruned_start = {(c["seed"], c["degree"]): c for c in (doc.get("early_stopping") or {}).get("cells", [])}
    lines = [f"## Recovery from the reconstructed model ({refit}) against recovery from the pruned weights", "",
             "The same never-stopped 3-epoch recovery (distillation) of CAHP's heads; test accuracy after epoch "
             "0 (before training), 1, 2, 3. `from pruned` is the early-stopping part's cell (`finetune`); "
             f"`from reconstructed` starts after a reconstruction ({refit}; `reconstruct+finetune`).", "",
             "| seed | degree | heads | from pruned | from reconstructed | reconstruction s |",
             "|---|---|---|---|---|---|"]
    for cell in rs["cells"]:
        other = pruned_start.get((cell["seed"], cell["degree"]))
        before = "–" if other is None else ", ".join(f"{100 * s['test']['accuracy']:.2f}" for s in other["stops"])
        after = ", ".join(f"{100 * s['test']['accuracy']:.2f}" for s in cell["stops"])
        seconds = (cell.get("reconstruction") or {}).get("seconds")
        lines.append(f"| {cell['seed']} | {cell['degree']} | {cell['heads_kept']} | {before} | {after} | "
                     f"{'–' if seconds is None else f'{seconds:.0f}'} |")
    return [*lines, ""]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m studies budget")
    p.add_argument("--parts", default=",".join(PARTS))
    p.add_argument("--seeds", default="42,43,44")
    p.add_argument("--degrees", default="2,6")
    p.add_argument("--runs", default="", help="compute only these whole runs (e.g. p2.0,p0.5), so that two "
                   "processes can share the budget part; the others are reported when recorded")
    p.add_argument("--patience", type=int, default=1, help="early stopping of the budget and imbalanced runs")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--data", type=Path, default=common.SST5)
    p.add_argument("--quality-cache", type=Path, default=common.RESULTS / "cache" / "quality_sst5")
    p.add_argument("--cache-dir", type=Path, default=common.RESULTS / "cache" / "budget_sst5")
    p.add_argument("--record-dir", type=Path, default=common.RESULTS / "budget_sst5",
                   help="where finished cells and runs' reports are kept (tracked by git)")
    p.add_argument("--report-only", action="store_true")
    args = p.parse_args(argv)
    parts = tuple(part for part in args.parts.split(",") if part)
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise SystemExit(f"--parts: unknown {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    wrong = sorted(set(filter(None, args.runs.split(","))) - set(BUDGET_RUNS) - set(IMBALANCED_RUNS))
    if wrong:
        raise SystemExit(f"--runs: unknown {', '.join(wrong)}; choose from "
                         f"{', '.join([*BUDGET_RUNS, *IMBALANCED_RUNS])}")
    common.pin_threads(args.threads)
    protocol = dataclasses.replace(quality.Protocol(), seeds=tuple(int(v) for v in args.seeds.split(",") if v),
                                   degrees=tuple(int(v) for v in args.degrees.split(",") if v))
    setup = Setup(protocol=protocol, base=common.minilm_path(), data_dir=args.data, quality_cache=args.quality_cache,
                  cache=args.cache_dir, record=args.record_dir, patience=args.patience,
                  only=tuple(name for name in args.runs.split(",") if name))

    def say(line: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)

    start = time.perf_counter()
    payload = run(setup, parts, compute=not args.report_only, say=say)
    payload["wall_s_this_invocation"] = time.perf_counter() - start
    payload["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
    path = common.save("budget_sst5.json", payload,
                       command=f"python -m studies budget {' '.join(argv or [])}".strip(),
                       protocol="the quality study's dense all-MiniLM-L6-v2 on SST-5; see studies/budget_study.py")
    text = markdown(json.loads(path.read_text()))
    (common.RESULTS / "budget_sst5.md").write_text(text)
    print(text)

