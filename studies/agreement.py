"""Run-to-run agreement of the head selection: two runs that differ only in the order of the samples.

The user's case: the same model and dataset, the rows in another order (or one row more), and the
selection is made again. Each run here takes the training split with its rows permuted by an order
seed and runs the engine's own analysis (:func:`cahp_engine.selection.analyze_heads`, the defaults:
stopping rules, 5 leave-one-shard-out shards) with the same configuration seed, so t-SNE and FasterPAM
are seeded alike and only the samples read, and the order they are read in, differ. (Not the shards
of one run: those are the leave-one-shard-out measure, and the consensus strategies' input.) Order
seeds 1 and 2 make the first pair, 3 and 4 the second, and so on.

For every degree, each run's choice is made at its own knee by every method: CAHP (``cahp``), each
consensus strategy, salience top-k and random choice at CAHP's head count (random is seeded by the
order seed, so its pairs are the floor: about m / (2N - m) for m of N heads). Per pair: the Jaccard
similarity of the kept heads and the difference of k*; the summary gives their mean, min and max
over the pairs, per task, stopping rule (``--plateau off`` is the engine's default; ``on`` adds the
opt-in plateau rule, so that its time and agreement can be compared) and degree.

Tasks are dataset directories (``--task NAME=DIR[,pair=COLUMN][,text=COLUMN][,label=COLUMN]``, any
layout :func:`cahp_engine.data.load_splits` reads; default SST-5 from ../shared/data). The model
(``--model``) is ``dense``: for SST-5 the quality study's dense all-MiniLM-L6-v2 (its cache, trained on
the pinned CPU path when missing, 30-60 min), for another task ``--dense NAME=DIR`` or one fine-tuned
here (3 epochs at lr 5e-5, seed 42, native CPU path, cached); or ``pretrained``: all-MiniLM-L6-v2 with a
new, seeded classification head (where the signature noise share plateaus on SST-5).

Each run is saved at once under the cache (default studies/results/cache/agreement/, not tracked by
git); a rerun of the same command skips the runs it finds, so a killed run resumes.

Run: ``python -m studies agreement [--threads 1] [--model dense|pretrained] [--plateau on,off]
[--pairs 5] [--degrees 2,6] [--task NAME=DIR ...] [--dense NAME=DIR ...] [--report-only]``
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from cahp_engine.config import CONSENSUS_STRATEGIES, PruningConfig
from cahp_engine.data import DatasetOptions, EncodedDataset, draw_subset, encode, load_splits, take_rows
from cahp_engine.models import load_classifier, save_pruned
from cahp_engine.recovery import TrainingRecipe, finetune
from cahp_engine.selection import PLATEAU_GAIN, Selection, analyze_heads, choose
from studies import common, quality

#: Every method compared, in the table's order.
METHODS: tuple[str, ...] = ("cahp", *CONSENSUS_STRATEGIES, "salience", "random")
PLATEAU_SETTINGS = ("on", "off")


@dataclass(frozen=True)
class Task:
    """A dataset directory and the columns to read."""

    name: str
    path: str
    text_column: str = "text"
    text_pair_column: str | None = None
    label_column: str = "label"

    def options(self) -> DatasetOptions:
        return DatasetOptions(text_column=self.text_column, text_pair_column=self.text_pair_column,
                              label_column=self.label_column)


def parse_task(text: str) -> Task:
    """``NAME=DIR[,pair=COLUMN][,text=COLUMN][,label=COLUMN]``."""
    head, *extras = text.split(",")
    name, sep, path = head.partition("=")
    if not sep or not name or not path:
        raise SystemExit(f"--task takes NAME=DIR[,pair=COLUMN][,text=COLUMN][,label=COLUMN], got {text!r}")
    keys = {"pair": "text_pair_column", "text": "text_column", "label": "label_column"}
    columns: dict[str, str] = {}
    for extra in extras:
        key, sep, value = extra.partition("=")
        if key not in keys or not sep or not value:
            raise SystemExit(f"--task: unknown or empty option {extra!r} (pair=, text=, label=)")
        columns[keys[key]] = value
    return Task(name=name, path=path, **columns)


@dataclass(frozen=True)
class Protocol:
    """Everything that decides the figures."""

    tasks: tuple[Task, ...] = (Task("sst5", str(common.SST5)),)
    model: str = "dense"
    pairs: int = 5
    degrees: tuple[int, ...] = (2, 6)
    plateau: tuple[str, ...] = ("off",)
    seed: int = 42
    resolution: int = 32
    batch_size: int = 32
    #: A seeded stratified subset of the training split (None: every row), for smoke runs.
    train_rows: int | None = None
    #: Fine-tuning of a dense model this study trains itself (a task other than SST-5, no --dense).
    dense_epochs: float = 3.0
    dense_lr: float = 5e-5
    dense: dict[str, str] = field(default_factory=dict)

    def order_seeds(self) -> list[int]:
        return list(range(1, 2 * self.pairs + 1))

    def config(self) -> PruningConfig:
        degrees = tuple(sorted({2, 3, 4, 5, 6} | set(self.degrees)))
        return PruningConfig(poly_degree=self.degrees[0], resolution=self.resolution, seed=self.seed,
                             batch_size=self.batch_size, reported_degrees=degrees)

    def describe(self) -> str:
        rows = "" if self.train_rows is None else f", {self.train_rows} training rows (stratified subset)"
        return (f"model {self.model}{rows}; per order seed in {self.order_seeds()}: the training split's rows "
                f"permuted with that seed, then analyze_heads with the defaults (stopping rules; plateau rule "
                f"{'/'.join(self.plateau)}; 5 stability shards; B={self.resolution}, batch {self.batch_size}, "
                f"seed {self.seed} for t-SNE, FasterPAM and the sample orders), and each method's choice at each "
                f"run's own knee for degrees {list(self.degrees)}: {', '.join(METHODS)} (salience top-k and random "
                "at CAHP's head count; random seeded by the order seed). Pairs: order seeds (1, 2), (3, 4), ...; "
                "per pair the Jaccard similarity of the kept heads and |k* difference|")


def _write_json(path: Path, doc: Any) -> None:
    """Through a temporary file and a rename: an interrupted run never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


def _heads(selection: Selection) -> list[list[int]]:
    return [[int(layer), int(head)] for layer, head in zip(*np.nonzero(selection.kept_mask), strict=True)]


def load_train(task: Task, tokenizer: Any, rows: int | None) -> EncodedDataset:
    """The task's training split, tokenised (a seeded stratified subset of ``rows`` when given)."""
    texts = load_splits(task.path, task.options()).train
    if rows is not None:
        texts = texts.subset(draw_subset(len(texts), rows, seed=0, labels=texts.labels))
    return encode(tokenizer, texts, max_length=512)


def model_for(task: Task, protocol: Protocol, *, base: str, cache: Path, device: torch.device,
              say: Callable[[str], None]) -> tuple[nn.Module, Any, dict[str, Any]]:
    """The model a task's runs analyse, its tokenizer and a record of where it came from."""
    num_labels = len(load_splits(task.path, task.options()).train.label_names)
    if protocol.model == "pretrained":
        loaded = load_classifier(base, num_labels=num_labels, seed=protocol.seed, device=device)
        return loaded.model.eval(), loaded.tokenizer, {"kind": "pretrained", "base": base, "head_seed": protocol.seed}
    if task.name in protocol.dense:
        loaded = load_classifier(protocol.dense[task.name], device=device)
        return loaded.model.eval(), loaded.tokenizer, {"kind": "dense", "path": protocol.dense[task.name]}
    if task.name == "sst5" and protocol.train_rows is None:
        # The quality study's dense model, shared through its cache (trained on the pinned path if missing).
        quality_cache = common.RESULTS / "cache" / "quality_sst5"
        model, tokenizer, record = quality.dense_model(base, Path(task.path), quality_cache, quality.Protocol(),
                                                       device, say)
        return model, tokenizer, {"kind": "dense", "path": str(quality_cache / "dense"), "test": record["test"]}
    directory = cache / task.name / "dense"
    if not (directory / "config.json").is_file():
        loaded = load_classifier(base, num_labels=num_labels, seed=protocol.seed)
        train = load_train(task, loaded.tokenizer, protocol.train_rows)
        say(f"{task.name}: dense fine-tuning, {protocol.dense_epochs:g} epochs at lr {protocol.dense_lr:g} on "
            f"{len(train)} rows (native CPU path)")
        finetune(loaded.model, train, TrainingRecipe(
            epochs=protocol.dense_epochs, lr=protocol.dense_lr, batch_size=protocol.batch_size, warmup_ratio=0.1,
            weight_decay=0.01, max_grad_norm=1.0, seed=protocol.seed, device=device))
        save_pruned(loaded.model, loaded.tokenizer, directory)
    loaded = load_classifier(str(directory), device=device)
    return loaded.model.eval(), loaded.tokenizer, {"kind": "dense", "path": str(directory), "trained_here": True}


def one_run(model: nn.Module, train: EncodedDataset, protocol: Protocol, order_seed: int,
            plateau: str) -> dict[str, Any]:
    """One selection on the rows permuted by ``order_seed``, and every method's choice at every degree."""
    start = time.perf_counter()
    permutation = np.random.default_rng(order_seed).permutation(len(train))
    rows = take_rows(train, permutation)
    config = protocol.config()
    analysis = analyze_heads(model, rows, config, plateau_gain=PLATEAU_GAIN if plateau == "on" else None)
    analysis_s = time.perf_counter() - start
    degrees: dict[str, Any] = {}
    for degree in protocol.degrees:
        k = analysis.knees[degree].k
        cahp = choose(analysis, k, "cahp")
        kept = {}
        for method in METHODS:
            seed = order_seed if method == "random" else config.seed
            kept[method] = _heads(cahp if method == "cahp" else choose(analysis, k, method, seed=seed))
        knees = [loo.knees[degree].k for loo in analysis.leave_one_out]
        degrees[str(degree)] = {"k_star": k, "knee_found": analysis.knees[degree].found,
                                "heads_kept": cahp.num_kept, "leave_one_out_k_stars": knees,
                                "k_median_of_runs": float(statistics.median([k, *knees])), "kept": kept}
    sig, cal = analysis.signature_sampling, analysis.calibration_sampling
    digest = hashlib.sha256(permutation[:256].astype(np.int64).tobytes()).hexdigest()[:16]
    return {
        "order_seed": order_seed, "plateau": plateau, "order_digest": digest, "config_seed": config.seed,
        "analysis_s": analysis_s, "wall_s": time.perf_counter() - start, "timings_s": analysis.timings,
        "signature_rows": analysis.signature_samples, "calibration_rows": analysis.calibration_samples,
        "signature_stopped": None if sig is None else sig.stopped,
        "calibration_stopped": None if cal is None else cal.stopped,
        "signature_measures": [] if sig is None else list(sig.measures),
        "degrees": degrees, "shape": list(analysis.shape),
    }


def _jaccard(a: list[list[int]], b: list[list[int]]) -> float:
    x, y = {tuple(h) for h in a}, {tuple(h) for h in b}
    return len(x & y) / len(x | y) if x | y else 1.0


def _spread(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"mean": None, "min": None, "max": None, "values": []}
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values), "values": values}


def summarise(runs: dict[int, dict[str, Any]], protocol: Protocol) -> dict[str, Any]:
    """Per degree and method, the pairs' Jaccard and |k* difference|; the runs' cost."""
    seeds = protocol.order_seeds()
    pairs = [(a, b) for a, b in zip(seeds[::2], seeds[1::2], strict=True) if a in runs and b in runs]
    out: dict[str, Any] = {"pairs": [list(p) for p in pairs], "degrees": {}, "cost": {
        "wall_s": _spread([r["wall_s"] for r in runs.values()]),
        "signature_rows": _spread([float(r["signature_rows"]) for r in runs.values()]),
        "calibration_rows": _spread([float(r["calibration_rows"]) for r in runs.values()]),
        "signature_stopped": sorted({str(r["signature_stopped"]) for r in runs.values()}),
    }}
    for degree in map(str, protocol.degrees):
        per = [(runs[a]["degrees"][degree], runs[b]["degrees"][degree]) for a, b in pairs]
        row: dict[str, Any] = {
            "k_star_difference": _spread([abs(x["k_star"] - y["k_star"]) for x, y in per]),
            "k_median_difference": _spread([abs(x["k_median_of_runs"] - y["k_median_of_runs"]) for x, y in per]),
            "methods": {},
        }
        for method in METHODS:
            row["methods"][method] = {
                "jaccard": _spread([_jaccard(x["kept"][method], y["kept"][method]) for x, y in per]),
                "heads_kept_difference": _spread([abs(len(x["kept"][method]) - len(y["kept"][method]))
                                                  for x, y in per]),
            }
        out["degrees"][degree] = row
    return out


def run(protocol: Protocol, *, base: str, cache: Path, device: torch.device, compute: bool = True,
        say: Callable[[str], None] = print) -> dict[str, Any]:
    """Compute what is missing (unless ``compute`` is False) and return every figure found in the cache."""
    results: dict[str, Any] = {}
    complete = True
    for task in protocol.tasks:
        loaded: tuple[nn.Module, Any, dict[str, Any]] | None = None
        train = None
        for plateau in protocol.plateau:
            folder = cache / task.name / protocol.model / f"plateau-{plateau}"
            runs: dict[int, dict[str, Any]] = {}
            for order_seed in protocol.order_seeds():
                path = folder / f"order-seed{order_seed}.json"
                found = _read_json(path)
                if found is None and compute:
                    if loaded is None:
                        loaded = model_for(task, protocol, base=base, cache=cache, device=device, say=say)
                        _check_manifest(cache / task.name / protocol.model, protocol, task, loaded[2])
                        train = load_train(task, loaded[1], protocol.train_rows)
                    assert train is not None
                    found = one_run(loaded[0], train, protocol, order_seed, plateau)
                    _write_json(path, found)
                    say(f"{task.name} {protocol.model} plateau {plateau} order seed {order_seed}: "
                        f"{found['signature_rows']} / {found['calibration_rows']} rows "
                        f"({found['signature_stopped']}), {found['wall_s']:.0f} s; " + ", ".join(
                            f"degree {d}: k*={v['k_star']}" for d, v in found["degrees"].items()))
                if found is None:
                    complete = False
                else:
                    runs[order_seed] = found
            results.setdefault(task.name, {})[plateau] = {"summary": summarise(runs, protocol),
                                                         "runs": {str(s): r for s, r in runs.items()}}
    return {"settings": {**asdict(replace(protocol, dense={})), "dense": protocol.dense},
            "methods": list(METHODS), "complete": complete, "tasks": results}


def _check_manifest(folder: Path, protocol: Protocol, task: Task, model: dict[str, Any]) -> None:
    """Refuse a cache written under another protocol or model: its runs would not be comparable."""
    wanted = {"task": asdict(task), "model": model, "seed": protocol.seed, "resolution": protocol.resolution,
              "batch_size": protocol.batch_size, "train_rows": protocol.train_rows,
              "degrees": list(protocol.degrees)}
    wanted = json.loads(json.dumps(wanted))
    found = _read_json(folder / "manifest.json")
    if found is None:
        _write_json(folder / "manifest.json", wanted)
    elif found != wanted:
        raise SystemExit(f"{folder} holds runs of another protocol ({found}); delete it or pass --cache-dir")


def _cell(spread: dict[str, Any], digits: int = 2) -> str:
    if spread["mean"] is None:
        return "–"
    return f"{spread['mean']:.{digits}f} ({spread['min']:.{digits}f}–{spread['max']:.{digits}f})"


def markdown(doc: dict[str, Any]) -> str:
    """The run-to-run table: methods as rows, task x stopping rule x degree as columns."""
    settings = doc["settings"]
    columns = [(task, plateau, degree) for task, per in doc["tasks"].items() for plateau in per
               for degree in map(str, settings["degrees"])]
    head = ("| method | " + " | ".join(f"{t}, plateau {p}, degree {d}" for t, p, d in columns) + " |\n"
            + "|---|" + "---|" * len(columns))
    lines = [f"# Run-to-run agreement of the head selection ({settings['model']} model)", "",
             f"Date {doc['date']}; command `{doc['command']}`; machine {doc['machine']['cpu']} "
             f"({doc['machine']['torch_threads']} torch threads).", "", f"Protocol: {doc['protocol']}.", "",
             ("" if doc["complete"] else "**Incomplete: some runs are missing.**"), "",
             "Jaccard similarity of the kept heads between the two runs of a pair, mean (min–max) over the pairs:",
             "", head]
    for method in doc["methods"]:
        lines.append(f"| {method} | " + " | ".join(
            _cell(doc["tasks"][t][p]["summary"]["degrees"][d]["methods"][method]["jaccard"]) for t, p, d in columns)
            + " |")
    lines.append("| \\|k* difference\\| | " + " | ".join(
        _cell(doc["tasks"][t][p]["summary"]["degrees"][d]["k_star_difference"], 1) for t, p, d in columns) + " |")
    lines.append("| \\|difference of the median of the K + 1 knees\\| | " + " | ".join(
        _cell(doc["tasks"][t][p]["summary"]["degrees"][d]["k_median_difference"], 1) for t, p, d in columns) + " |")
    lines += ["", "Cost per run (analysis and every choice), mean (min–max):", "",
              "| task | plateau rule | wall s | signature rows | calibration rows | signature pass stopped |",
              "|---|---|---|---|---|---|"]
    for task, per in doc["tasks"].items():
        for plateau, block in per.items():
            cost = block["summary"]["cost"]
            lines.append(f"| {task} | {plateau} | {_cell(cost['wall_s'], 1)} | {_cell(cost['signature_rows'], 0)} | "
                         f"{_cell(cost['calibration_rows'], 0)} | {', '.join(cost['signature_stopped'])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m studies agreement")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--model", choices=("dense", "pretrained"), default="dense")
    p.add_argument("--plateau", default="off",
                   help="comma-separated: off (the engine's default rules), on (with the opt-in plateau rule)")
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--degrees", default="2,6")
    p.add_argument("--task", action="append", help="NAME=DIR[,pair=COLUMN][,text=COLUMN][,label=COLUMN]; "
                   "repeatable (default: sst5 from ../shared/data)")
    p.add_argument("--dense", action="append", default=[], help="NAME=DIR: the fine-tuned model of a task")
    p.add_argument("--train-rows", type=int, help="a stratified subset of each training split (smoke runs)")
    p.add_argument("--cache-dir", type=Path, default=common.RESULTS / "cache" / "agreement")
    p.add_argument("--output", default="agreement", help="result files studies/results/<output>.{json,md}")
    p.add_argument("--report-only", action="store_true")
    args = p.parse_args(argv)
    common.pin_threads(args.threads)
    plateau = tuple(v for v in args.plateau.split(",") if v)
    if not plateau or set(plateau) - set(PLATEAU_SETTINGS):
        raise SystemExit(f"--plateau takes on and/or off, comma-separated, got {args.plateau!r}")
    dense = dict(item.split("=", 1) for item in args.dense)
    protocol = Protocol(tasks=tuple(parse_task(t) for t in args.task) if args.task else Protocol().tasks,
                        model=args.model, pairs=args.pairs, degrees=tuple(int(v) for v in args.degrees.split(",")),
                        plateau=plateau, train_rows=args.train_rows, dense=dense)

    def say(line: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)

    start = time.perf_counter()
    base = "" if args.report_only else common.minilm_path()
    payload = run(protocol, base=base, cache=args.cache_dir, device=torch.device(args.device),
                  compute=not args.report_only, say=say)
    payload["wall_s_this_invocation"] = time.perf_counter() - start
    command = ("python -m studies agreement " + " ".join(argv or [])).strip()
    path = common.save(f"{args.output}.json", payload, command=command, protocol=protocol.describe())
    text = markdown(json.loads(path.read_text()))
    (common.RESULTS / f"{args.output}.md").write_text(text)
    print(text)
    print(f"saved {path} and its .md")
