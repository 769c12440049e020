"""The paper's two benchmarks, SST-5 and MNLI, measured the paper's way for every selection strategy, and
the default strategy decided from them by a rule fixed before the figures (:mod:`studies.benchmarks_report`,
``verdict``; the same rule in docs/performance.md).

all-MiniLM-L6-v2 is fine-tuned densely once per task (3 epochs at lr 5e-5, batch 32, seed 42, on the
pinned CPU path so that another session on another machine retrains the very same model): SST-5's is
the quality study's own model (its cache, ``studies/results/cache/quality_sst5``); MNLI's is trained on
its 20,094 training pairs and scored on the 9,815 pairs of ``validation_matched``. Per task and seed,
CAHP's analysis runs once (``analyze_heads``, the engine's defaults, timed with its peak memory: the
selection's cost) and every strategy chooses at CAHP's knee of each degree (``choose``: the baselines keep
CAHP's count, the consensus strategies k* plus layer safety). Each pruned model is scored on the test
split, recovered by **plain fine-tuning** (cross-entropy, no teacher, no early stopping, no class
weights: pinned here, so a change of the engine's default recovery changes nothing) for the paper's 3
epochs at lr 2e-5, and scored again: accuracy and macro-F1 before and after.

SST-5's cells of ``cahp``, ``salience`` and ``random`` are the quality study's cross-entropy cells of
the same protocol and dense model (``studies/results/quality_sst5_paper.json``): they are reused when
this study's analysis keeps the same heads, and only their before-recovery scores are computed here.

Cells run in the order that makes a partial record say the most (:func:`plan`): seed 42 before 43 and
44, degree 6 before 2, SST-5 before MNLI, MNLI's run-to-run agreement after seed 42. Every finished
selection and cell is written at once to the record directory (default ``studies/results/benchmarks/``,
tracked by git: the study spans sessions), the report beside it (``studies/results/benchmarks.{json,md,png}``
for the default record); models go to the cache (not tracked). A cell is claimed under a lock, so several
processes can share the plan; a killed process resumes at its unfinished cell.
A strategy registered later (the salience top-k within CAHP's per-layer counts) joins with
``--strategies``: its heads are chosen from a redone analysis that must keep every recorded choice.

``--start reconstructed`` measures the other start of the same recovery: each pruned model is first
reconstructed as a ``recovery: reconstruct+finetune`` run does (the engine's default refit, its
calibration rows drawn with the seed), then fine-tuned by the same plain recipe, the test split scored
after the reconstruction and after every epoch. Its cells are kept apart (``...-reconstructed.json``) and
read against the pruned start's cells of the same heads (:func:`start_rows`); the rule never sees them.

Run: ``python -m studies benchmarks [--tasks sst5,mnli] [--strategies ...] [--seeds 42,43,44]
[--degrees 6,2] [--threads 1] [--max-cells N] [--start pruned|reconstructed] [--report-only]``
"""

from __future__ import annotations

import argparse
import copy
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from cahp_engine.config import REPORTED_DEGREES, PruningConfig
from cahp_engine.data import DatasetOptions, EncodedDataset
from cahp_engine.models import heads_per_layer, prune_heads
from cahp_engine.recovery import FineTuning, TrainingRecipe, evaluate, finetune
from cahp_engine.selection import analyze_heads, choose
from studies import agreement, common, quality
from studies import benchmarks_report as report

#: The strategies measured by default (``random`` as the floor). A strategy registered later is added with
#: ``--strategies``; the rule counts it once it is measured in full.
STRATEGIES: tuple[str, ...] = ("cahp", "stability-selection", "coassociation", "salience", "random")
#: The strategies whose SST-5 cells the quality study already holds (cross-entropy, the same protocol).
QUALITY_STRATEGIES = ("cahp", "salience", "random")
QUALITY_RECORD = common.RESULTS / "quality_sst5_paper.json"
#: Where a cell's recovery starts: from the pruned weights (the paper's), or from the pruned model after the
#: engine's layer-wise reconstruction (what ``recovery: reconstruct+finetune`` does).
STARTS = ("pruned", "reconstructed")
#: ../shared/data beside the checkout (a worktree sits one level deeper than the main checkout).
DATA = next((p for p in (Path(__file__).resolve().parents[i] / "shared" / "data" for i in (2, 3)) if p.is_dir()),
            common.SST5.parent)


@dataclass(frozen=True)
class Task:
    """A benchmark: where its splits are, which columns and which split is the test."""

    name: str
    path: Path
    eval_split: str
    text_column: str = "text"
    text_pair_column: str | None = None

    def options(self) -> DatasetOptions:
        return DatasetOptions(text_column=self.text_column, text_pair_column=self.text_pair_column,
                              eval_split=self.eval_split)

    def agreement_task(self) -> str:
        pair = f",text={self.text_column},pair={self.text_pair_column}" if self.text_pair_column else ""
        return f"{self.name}={self.path}{pair}"


TASKS = {"sst5": Task("sst5", DATA / "sst5", "test"),
         "mnli": Task("mnli", DATA / "mnli", "validation_matched", "premise", "hypothesis")}


@dataclass(frozen=True)
class Setup:
    """Everything that decides the figures and where they go."""

    tasks: tuple[Task, ...]
    base: str
    cache: Path
    record: Path
    strategies: tuple[str, ...] = STRATEGIES
    seeds: tuple[int, ...] = (42, 43, 44)
    degrees: tuple[int, ...] = (6, 2)
    dense: quality.Protocol = quality.Protocol()  # the dense recipe (the quality study's)
    recovery_epochs: float = 3.0
    recovery_lr: float = 2e-5
    device: torch.device = torch.device("cpu")
    selection_overrides: dict[str, Any] = field(default_factory=dict)  # the smoke test's tiny analyses
    quality_record: Path | None = QUALITY_RECORD
    #: Tasks whose dense model lives in another study's cache: SST-5's is the quality study's.
    shared_caches: dict[str, Path] = field(default_factory=lambda: {"sst5": common.RESULTS / "cache" / "quality_sst5"})
    agreement_pairs: int = 5
    announce: Path | None = None  # a file told each dense model's path and test accuracy once it is trained
    start: str = "pruned"  # one of STARTS

    def protocol(self) -> dict[str, Any]:
        return {"model": self.dense.model, "dense": self.dense.dense_key(), "seeds": list(self.seeds),
                "degrees": list(self.degrees), "strategies": list(self.strategies),
                "recovery": {"kind": "plain fine-tuning (cross-entropy, no teacher, no early stopping)",
                             "epochs": self.recovery_epochs, "lr": self.recovery_lr, "batch_size": 32,
                             "warmup_ratio": 0.1, "weight_decay": 0.01, "max_grad_norm": 1.0, "seed": "the run seed"},
                "tasks": {t.name: {"path": str(t.path), "test_split": t.eval_split} for t in self.tasks}}


def _read(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


@contextmanager
def claimed(path: Path, wait: bool = False) -> Iterator[bool]:
    """Hold ``path``'s lock (``wait``: until it is free); yield whether this process holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True


# --------------------------------------------------------------------------- dense models and data


class Loaded:
    """A task's dense model, tokenised splits and dense record, loaded on first use."""

    def __init__(self, setup: Setup, task: Task, say: Callable[[str], None]) -> None:
        self.setup, self.task, self.say = setup, task, say
        self._model: tuple[nn.Module, EncodedDataset, EncodedDataset, dict[str, Any]] | None = None

    def cache(self) -> Path:
        return self.setup.shared_caches.get(self.task.name, self.setup.cache / self.task.name)

    def get(self) -> tuple[nn.Module, EncodedDataset, EncodedDataset, dict[str, Any]]:
        if self._model is None:
            cache, recorded = self.cache(), self.setup.record / self.task.name / "dense.json"
            if _read(cache / "dense.json") is None and recorded.is_file():
                quality._write_json(cache / "dense.json", _read(recorded))  # retrained, then checked against it
            with claimed(cache / "dense.lock", wait=True):
                model, tokenizer, record = quality.dense_model(self.setup.base, self.task.path, cache, self.setup.dense,
                                                               self.setup.device, self.say, options=self.task.options())
            if not recorded.is_file():
                quality._write_json(recorded, {**record, "path": str(cache / "dense")})
                if self.setup.announce is not None:
                    with self.setup.announce.open("a") as handle:
                        handle.write(f"- {self.task.name}: `{cache / 'dense'}` — all-MiniLM-L6-v2 fine-tuned by "
                                     f"`python -m studies benchmarks`, test accuracy "
                                     f"{100 * record['test']['accuracy']:.2f} % (macro-F1 "
                                     f"{100 * record['test']['macro_f1']:.2f}) on {self.task.eval_split} "
                                     f"({record['test']['n']} rows); {datetime.now(UTC):%Y-%m-%d %H:%M} UTC\n")
            train, test = quality.load_data(self.task.path, tokenizer, self.setup.dense, self.task.options())
            self.say(f"{self.task.name}: dense test accuracy {record['test']['accuracy']:.4f} "
                     f"({len(train)} train / {len(test)} test rows), model in {cache / 'dense'}")
            self._model = (model, train, test, record)
        return self._model


# --------------------------------------------------------------------------- selections


def _kept(selection: Any) -> list[list[int]]:
    return [[int(layer), int(head)] for layer, head in zip(*np.nonzero(selection.kept_mask), strict=True)]


def analyse(model: nn.Module, train: EncodedDataset, setup: Setup, seed: int) -> dict[str, Any]:
    """One analysis at ``seed``, timed with its peak memory; every strategy's heads at every degree's knee."""
    config = PruningConfig(poly_degree=setup.degrees[0], resolution=setup.dense.resolution, seed=seed,
                           batch_size=setup.dense.batch_size,
                           reported_degrees=tuple(sorted(set(REPORTED_DEGREES) | set(setup.degrees))),
                           **setup.selection_overrides)
    start = time.perf_counter()
    with common.PeakRss(interval=0.05) as rss:
        analysis = analyze_heads(model, train, config)
    wall = time.perf_counter() - start
    degrees: dict[str, Any] = {}
    for degree in setup.degrees:
        knee = analysis.knees[degree]
        kept = {name: _kept(choose(analysis, knee.k, name, seed=seed)) for name in setup.strategies}
        degrees[str(degree)] = {"k_star": knee.k, "knee_found": knee.found, "kept": kept}
    return {"seed": seed, "shape": list(analysis.shape), "analysis_s": wall, "timings_s": analysis.timings,
            "peak_rss_above_start_mib": (rss.peak - rss.start) / 2**20, "rss_start_mib": rss.start / 2**20,
            "signature_rows": analysis.signature_samples, "calibration_rows": analysis.calibration_samples,
            "train_rows": len(train), "load_average": os.getloadavg()[0], "degrees": degrees}


def selection(setup: Setup, loaded: Loaded, seed: int) -> dict[str, Any]:
    """The recorded selection of (task, seed), made here when missing or when it lacks a strategy or a
    degree (the analysis is redone and must keep every recorded choice)."""
    path = setup.record / loaded.task.name / f"selection-seed{seed}.json"
    with claimed(path.with_name(path.name + ".lock"), wait=True):
        found = _read(path)
        if found is not None and all(str(d) in found["degrees"] and set(setup.strategies) <= set(
                found["degrees"][str(d)]["kept"]) for d in setup.degrees):
            return dict(found)
        model, train, _, _ = loaded.get()
        made = analyse(model, train, setup, seed)
        for degree, info in (found or {}).get("degrees", {}).items():
            for name, heads in info["kept"].items():
                if made["degrees"].get(degree, {}).get("kept", {}).get(name, heads) != heads:
                    raise SystemExit(f"{loaded.task.name} seed {seed}: the analysis no longer keeps the recorded "
                                     f"{name} heads at degree {degree}; move {path} aside to start that task again")
        if found is not None:  # keep the first measurement of the cost and every recorded degree
            made = {**made, **{k: found[k] for k in found if k != "degrees"},
                    "degrees": {**found["degrees"], **made["degrees"]}}
        quality._write_json(path, made)
        loaded.say(f"{loaded.task.name} seed {seed}: selection in {made['analysis_s']:.0f} s, peak "
                   f"+{made['peak_rss_above_start_mib']:.0f} MiB; " + ", ".join(
                       f"degree {d}: k*={v['k_star']}" for d, v in made["degrees"].items()))
        return made


# --------------------------------------------------------------------------- cells


def cell_path(setup: Setup, task: str, seed: int, degree: int, strategy: str, start: str | None = None) -> Path:
    start = start or setup.start
    suffix = "" if start == "pruned" else f"-{start}"
    return setup.record / task / "cells" / f"seed{seed}-degree{degree}-{strategy}{suffix}.json"


def _scores(model: nn.Module, data: EncodedDataset, device: torch.device) -> dict[str, Any]:
    m = evaluate(model, data, batch_size=32, device=device)
    return {"accuracy": m.accuracy, "macro_f1": m.macro_f1, "recall": list(m.recall)}


def _pruned(dense: nn.Module, heads: list[list[int]]) -> nn.Module:
    pruned = copy.deepcopy(dense)
    kept: dict[int, list[int]] = {layer: [] for layer in range(len(heads_per_layer(dense)))}
    for layer, head in heads:
        kept[layer].append(head)
    prune_heads(pruned, kept)
    return pruned


def _quality_cell(setup: Setup, seed: int, degree: int, strategy: str, heads: list[list[int]]) -> Any:
    """The quality study's cross-entropy cell of the same protocol, when it kept these very heads."""
    if setup.quality_record is None or strategy not in QUALITY_STRATEGIES or not setup.quality_record.is_file():
        return None
    doc = _read(setup.quality_record)
    if (doc["settings"]["recovery_epochs"], doc["settings"]["recovery_lr"]) != (setup.recovery_epochs,
                                                                               setup.recovery_lr):
        return None
    sel = doc["selections"].get(str(seed), {}).get("degrees", {}).get(str(degree))
    if sel is None or sel["kept"][strategy] != heads:
        return None
    return next((c for c in doc["cells"] if (c["seed"], c["degree"], c["strategy"], c.get("loss", "ce"))
                 == (seed, degree, strategy, "ce")), None)


def _recipe(setup: Setup, seed: int) -> TrainingRecipe:
    return TrainingRecipe(epochs=setup.recovery_epochs, lr=setup.recovery_lr, batch_size=32, warmup_ratio=0.1,
                          weight_decay=0.01, max_grad_norm=1.0, seed=seed, device=setup.device)


def _reconstructed_cell(setup: Setup, dense: nn.Module, pruned: nn.Module, train: EncodedDataset,
                        test: EncodedDataset, seed: int) -> dict[str, Any]:
    """``--start reconstructed``: reconstruct ``pruned`` in place as a ``reconstruct+finetune`` run does, then
    fine-tune it by the plain recipe epoch by epoch, the test split scored after each stop (outside the
    timed training: the scoring draws nothing from the fine-tuning's random state)."""
    reconstruction = quality.reconstruct_as_a_run(dense, pruned, train, seed, setup.device)
    reconstructed = _scores(pruned, test, setup.device)
    tuning = FineTuning(pruned, train, _recipe(setup, seed))
    by_epoch = [{"epoch": 0.0, "train_s": 0.0, "test": reconstructed}]
    while not tuning.done:
        trained = tuning.result().wall_s
        tuning.advance()
        by_epoch.append({"epoch": tuning.epoch, "train_s": tuning.result().wall_s - trained,
                         "test": _scores(pruned, test, setup.device)})
    result = tuning.finish()
    return {"reconstructed": reconstructed, "after": by_epoch[-1]["test"], "by_epoch": by_epoch,
            "reconstruction": reconstruction,
            "recovery": {"wall_s": result.wall_s, "steps": result.steps, "loss_per_epoch": list(result.loss_per_epoch)}}


def run_cell(setup: Setup, loaded: Loaded, seed: int, degree: int, strategy: str) -> dict[str, Any]:
    """Prune to the strategy's heads, score, recover by plain fine-tuning, score again (``--start
    reconstructed``: reconstruct before the recovery, and score after it and after every epoch too)."""
    heads = selection(setup, loaded, seed)["degrees"][str(degree)]["kept"][strategy]
    dense, train, test, _ = loaded.get()
    start, cpu, load = time.perf_counter(), time.process_time(), os.getloadavg()[0]
    pruned = _pruned(dense, heads)
    before = _scores(pruned, test, setup.device)
    extra: dict[str, Any] = {}
    reused = (_quality_cell(setup, seed, degree, strategy, heads)
              if loaded.task.name == "sst5" and setup.start == "pruned" else None)
    if setup.start == "reconstructed":
        extra = _reconstructed_cell(setup, dense, pruned, train, test, seed)
        after, recovery = extra.pop("after"), extra.pop("recovery")
    elif reused is not None:
        # The same weights scored on another processor's kernels may flip a borderline row or two.
        if abs(reused["accuracy_before_recovery"] - before["accuracy"]) * len(test) > 3.5:
            raise SystemExit(f"sst5 seed {seed} degree {degree} {strategy}: the pruned model scores "
                             f"{before['accuracy']:.4f} before recovery where the quality study's scored "
                             f"{reused['accuracy_before_recovery']:.4f}: not the same dense model")
        after = {k: reused[k] for k in ("accuracy", "macro_f1", "recall")}
        recovery = {**reused["recovery"], "reused_from": str(setup.quality_record.name if setup.quality_record else "")}
    else:
        result = finetune(pruned, train, _recipe(setup, seed))
        after = _scores(pruned, test, setup.device)
        recovery = {"wall_s": result.wall_s, "steps": result.steps, "loss_per_epoch": list(result.loss_per_epoch)}
    per_layer = [0] * len(heads_per_layer(dense))
    for layer, _ in heads:
        per_layer[layer] += 1
    return {"task": loaded.task.name, "seed": seed, "degree": degree, "strategy": strategy, "start": setup.start,
            "heads_kept": len(heads), "kept_per_layer": per_layer, "heads_per_layer": heads_per_layer(dense),
            "before": before, "after": after, "recovery": recovery, **extra, "wall_s": time.perf_counter() - start,
            "cpu_s": time.process_time() - cpu,
            "load_average": [load, os.getloadavg()[0]], "date": datetime.now(UTC).isoformat(timespec="seconds")}


# --------------------------------------------------------------------------- the plan


def plan(setup: Setup) -> list[tuple[str, ...]]:
    """Every step, most decisive first: the SST-5 cells whose recovery the quality study holds (only their
    scores before recovery to compute); then per seed, degree 6 then 2, each task, every strategy; MNLI's
    (any pair task's) run-to-run agreement after the first seed."""
    steps: list[tuple[str, ...]] = []
    if setup.quality_record is not None and setup.start == "pruned" and any(t.name == "sst5" for t in setup.tasks):
        steps += [("cell", "sst5", str(seed), str(degree), s) for seed in setup.seeds for degree in setup.degrees
                  for s in setup.strategies if s in QUALITY_STRATEGIES]
    for i, seed in enumerate(setup.seeds):
        for degree in setup.degrees:
            steps += [step for t in setup.tasks for s in setup.strategies
                      if (step := ("cell", t.name, str(seed), str(degree), s)) not in steps]
        if i == 0 and setup.start == "pruned":
            steps += [("agreement", t.name) for t in setup.tasks if t.text_pair_column]
    return steps


def agreement_output(task: str) -> str:
    return f"agreement_{task}"


def run_agreement(setup: Setup, loaded: Loaded) -> None:
    """``python -m studies agreement`` on the task's dense model (sample-order pairs, the engine's defaults)."""
    loaded.get()
    agreement.main(["--model", "dense", "--plateau", "off", "--pairs", str(setup.agreement_pairs),
                    "--degrees", ",".join(map(str, sorted(setup.degrees))), "--threads", str(torch.get_num_threads()),
                    "--task", loaded.task.agreement_task(), "--dense", f"{loaded.task.name}={loaded.cache() / 'dense'}",
                    "--cache-dir", str(setup.cache / "agreement"), "--output", agreement_output(loaded.task.name)])


def run(setup: Setup, *, compute: bool, say: Callable[[str], None], max_cells: int | None = None) -> dict[str, Any]:
    """Work through :func:`plan` (or, with ``compute=False``, only read the record); the payload."""
    loaded = {t.name: Loaded(setup, t, say) for t in setup.tasks}
    done = 0
    for step in plan(setup) if compute else []:
        if max_cells is not None and done >= max_cells:
            break
        if step[0] == "agreement":
            if not (common.RESULTS / f"{agreement_output(step[1])}.json").is_file():
                run_agreement(setup, loaded[step[1]])
            continue
        _, task, seed, degree, strategy = step
        path = cell_path(setup, task, int(seed), int(degree), strategy)
        if path.is_file():
            continue
        with claimed(path.with_name(path.name + ".lock")) as mine:
            if not mine or path.is_file():
                continue  # another process has it, or finished it meanwhile
            cell = run_cell(setup, loaded[task], int(seed), int(degree), strategy)
            quality._write_json(path, cell)
            done += 1
            middle = f" -> {cell['reconstructed']['accuracy']:.4f} reconstructed" if "reconstructed" in cell else ""
            say(f"{task} seed {seed} degree {degree} {strategy:20s}: {cell['heads_kept']} heads, accuracy "
                f"{cell['before']['accuracy']:.4f}{middle} -> {cell['after']['accuracy']:.4f} in "
                f"{cell['wall_s']:.0f} s" + (" (recovery reused)" if "reused_from" in cell["recovery"] else ""))
    # The report covers every task of the rule, not only those this process computes: a `--tasks sst5` run
    # must not call half the cells complete.
    names = list(dict.fromkeys([*TASKS, *(t.name for t in setup.tasks)]))
    payload = report.collect(setup.record, names, setup.strategies, setup.seeds, setup.degrees,
                             protocol=setup.protocol(),
                             agreement_outputs={name: agreement_output(name) for name in names})
    return {**payload, "reconstructed_start": start_rows(setup, names)}


def start_rows(setup: Setup, tasks: list[str]) -> list[dict[str, Any]]:
    """Every recorded ``--start reconstructed`` cell beside the pruned start's cell of the same task, seed,
    degree and strategy (None where that one is not recorded): test accuracy before recovery, after the
    reconstruction, after each epoch, and the pruned start's after its recovery."""
    rows: list[dict[str, Any]] = []
    for task in tasks:
        for seed in setup.seeds:
            for degree in setup.degrees:
                for strategy in setup.strategies:
                    mine = _read(cell_path(setup, task, seed, degree, strategy, "reconstructed"))
                    if mine is None:
                        continue
                    theirs = _read(cell_path(setup, task, seed, degree, strategy, "pruned"))
                    rows.append({"task": task, "seed": seed, "degree": degree, "strategy": strategy,
                                 "heads_kept": mine["heads_kept"], "before": mine["before"]["accuracy"],
                                 "by_epoch": [[e["epoch"], e["test"]["accuracy"]] for e in mine["by_epoch"]],
                                 "reconstruction_s": mine["reconstruction"]["seconds"],
                                 "recovery_s": mine["recovery"]["wall_s"],
                                 "from_pruned": None if theirs is None else theirs["after"]["accuracy"],
                                 "from_pruned_before": None if theirs is None else theirs["before"]["accuracy"],
                                 "from_pruned_recovery_s": None if theirs is None else theirs["recovery"]["wall_s"]})
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m studies benchmarks")
    p.add_argument("--tasks", default="sst5,mnli")
    p.add_argument("--strategies", default=",".join(STRATEGIES),
                   help="registered strategy names (a later one joins here; `random` is the floor)")
    p.add_argument("--seeds", default="42,43,44")
    p.add_argument("--degrees", default="6,2", help="in the order they are computed")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-cells", type=int, help="stop after computing this many cells")
    p.add_argument("--cache-dir", type=Path, default=common.RESULTS / "cache" / "benchmarks")
    p.add_argument("--record-dir", type=Path, default=common.RESULTS / "benchmarks",
                   help="where finished selections and cells are kept (tracked by git); the report "
                        "(benchmarks.json, .md, .png) is written beside it")
    p.add_argument("--announce", type=Path, help="a file to append each dense model's path and accuracy to")
    p.add_argument("--start", choices=STARTS, default="pruned",
                   help="where each recovery starts: the pruned weights (the paper's), or the pruned model after "
                        "the engine's layer-wise reconstruction (cells kept apart; the rule never reads them)")
    p.add_argument("--report-only", action="store_true", help="rebuild the tables and figure from the record")
    args = p.parse_args(argv)
    names = [n for n in args.tasks.split(",") if n]
    if not names or set(names) - set(TASKS):
        raise SystemExit(f"--tasks: choose from {', '.join(TASKS)}, got {args.tasks!r}")
    from cahp_engine.config import STRATEGIES as REGISTERED

    strategies = tuple(s for s in args.strategies.split(",") if s)
    if not strategies or set(strategies) - set(REGISTERED):
        raise SystemExit(f"--strategies: choose from {', '.join(REGISTERED)}, got {args.strategies!r}")
    common.pin_threads(args.threads)
    setup = Setup(tasks=tuple(TASKS[n] for n in names), base="" if args.report_only else common.minilm_path(),
                  cache=args.cache_dir, record=args.record_dir, strategies=strategies,
                  seeds=tuple(int(v) for v in args.seeds.split(",") if v),
                  degrees=tuple(int(v) for v in args.degrees.split(",") if v), announce=args.announce,
                  start=args.start)

    def say(line: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)

    payload = run(setup, compute=not args.report_only, say=say, max_cells=args.max_cells)
    command = f"python -m studies benchmarks {' '.join(argv or [])}".strip()
    out = args.record_dir.parent  # beside the record: one kept elsewhere never overwrites the tracked report
    path = common.save("benchmarks.json", payload, command=command, results=out,
                       protocol="all-MiniLM-L6-v2 fine-tuned per task; see studies/benchmarks.py")
    doc = json.loads(path.read_text())
    (out / "benchmarks.md").write_text(report.markdown(doc))
    report.plot_retention(doc, out / "benchmarks.png")
    print(report.markdown(doc))


