"""SST-5 test accuracy of CAHP against global salience top-k and random choice at the same head count.

all-MiniLM-L6-v2 is fine-tuned densely once (cached). Then, per seed, CAHP's selection runs once
(signatures, graph space, MSS curve, salience) and serves every polynomial degree (its knee comes
from the same curve) and both baselines, which keep exactly as many heads as CAHP kept for that
seed and degree. Every pruned model gets the same recovery fine-tuning and is scored on the test
split. Finished cells (seed, degree, strategy) go to a cache file at once, so a rerun resumes.

The strategies are the engine's registered ones (:func:`cahp_engine.selection.choose`), what ``cahp
prune --strategy`` runs; this grid compares the three of the paper's Table I.

The cache (default studies/results/cache/<protocol name>/) is not tracked by git: a rerun of the same
command on the same checkout resumes it. A grid that spans sessions on other checkouts needs its
cache's JSON state (the dense record, the selections, the finished cells, the runs) committed on
purpose on a study branch; the dense model's weights never are: a checkout without them retrains the
dense model on the pinned CPU path and refuses to go on unless it matches the cached record.

With ``--losses ce,distill`` every cell is recovered twice: with cross-entropy (the paper's) and with
distillation from the dense model (the engine's default; the teacher's logits over the training split
are computed once and cached as ``teacher-logits.npy``). Cells recovered with cross-entropy keep the
key they always had, so caches from before distillation resume.

Run: ``python -m studies quality [--threads 2] [--paper-protocol] [--smoke] [--losses ce,distill]
[--report-only]``
"""

from __future__ import annotations

import argparse
import copy
import fcntl
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers as tf
from torch import nn

from cahp_engine._torch import resolve_device
from cahp_engine.config import REPORTED_DEGREES, PruningConfig
from cahp_engine.data import DatasetOptions, EncodedDataset, LabelledTexts, draw_subset, encode, load_splits
from cahp_engine.models import heads_per_layer, load_classifier, prune_heads, save_pruned
from cahp_engine.recovery import (
    AuxiliaryLoss,
    Distillation,
    ReconstructionOptions,
    TeacherLogits,
    TeacherRecord,
    TrainingRecipe,
    evaluate,
    finetune,
    reconstruct,
    teacher_logits,
)
from cahp_engine.run._reconstruct import calibration_batches, reconstruct_pruned
from cahp_engine.selection import HeadAnalysis, Selection, analyze_heads, choose, selection_stability
from studies import common
from studies.common import minilm_path

#: Names in the engine's strategy table (``cahp_engine.config.STRATEGIES``) that the grid compares.
STRATEGIES = ("cahp", "salience", "random")
LABELS = {"cahp": "CAHP", "salience": "Salience top-k", "random": "Random"}
TOTAL_HEADS_MINILM = 72
PUBLIC_MODEL = "all-MiniLM-L6-v2"
#: The public CAHP implementation on the same model and data, as the project's requirements quote it (seed 42
#: for the accuracies; the Jaccard ranges are over its seeds).
PUBLIC = {
    "source": "public CAHP implementation, all-MiniLM-L6-v2 on SST-5 (figures quoted in the requirements)",
    "protocol": "dense 3 epochs at lr 5e-5, B=32, seed 42; recovery 1 epoch at lr 2e-5",
    "dense_accuracy": 0.504,
    "degrees": {
        "2": {"heads_kept": 35, "retention": 35 / TOTAL_HEADS_MINILM, "accuracy": 0.492, "jaccard": [0.63, 0.71]},
        "6": {"heads_kept": 16, "retention": 16 / TOTAL_HEADS_MINILM, "accuracy": 0.471, "jaccard": [0.55, 0.60]},
    },
}
#: The paper's Table I for CAHP on BERT-base (144 heads, 10 seeds), for the shape of the trade-off only.
PAPER_BERT_BASE = {"dense_accuracy": 0.536, "degrees": {"2": {"retention": 0.479, "accuracy": 0.527},
                                                         "6": {"retention": 0.181, "accuracy": 0.510}}}


@dataclass(frozen=True)
class Protocol:
    """Everything that decides the figures. Warm-up 10%, weight decay 0.01 and gradient clipping at
    1.0 are the engine's defaults (paper Section IV-B.5) for both fine-tunings."""

    name: str = "quality_sst5"
    model: str = PUBLIC_MODEL
    seeds: tuple[int, ...] = (42, 43, 44)
    degrees: tuple[int, ...] = (2, 6)
    resolution: int = 32
    batch_size: int = 32
    dense_epochs: float = 3.0
    dense_lr: float = 5e-5
    dense_seed: int = 42
    recovery_epochs: float = 1.0
    recovery_lr: float = 2e-5
    train_rows: int | None = None
    test_rows: int | None = None
    score_before_recovery: bool = True
    losses: tuple[str, ...] = ("ce",)
    distill_alpha: float = 0.5
    distill_temperature: float = 4.0
    #: "pinned": the dense model is trained on the CPU code path every x86-64 processor runs alike
    #: (:data:`DENSE_PINS`), so a later session on another machine retrains the very same model and resumes
    #: the cells; "native": the fastest path, reproducible only on the same processor type.
    dense_cpu_path: str = "pinned"

    def variants(self) -> list[tuple[str, str]]:
        """(strategy, recovery loss) of every cell of a seed and degree."""
        return [(strategy, loss) for loss in self.losses for strategy in STRATEGIES]

    def dense_key(self) -> dict[str, Any]:
        """What the cached dense model and selections depend on (not the recovery recipe)."""
        keys = ("model", "resolution", "batch_size", "dense_epochs", "dense_lr", "dense_seed", "train_rows",
                "test_rows", "dense_cpu_path")
        return {k: getattr(self, k) for k in keys}

    def cells_file(self) -> str:
        return f"cells-recovery-{self.recovery_epochs:g}ep-lr{self.recovery_lr:g}.json"

    def describe(self) -> str:
        rows = "" if self.train_rows is None else f" ({self.train_rows} train / {self.test_rows} test rows)"
        losses = " and ".join("cross-entropy" if loss == "ce" else
                              f"distillation from the dense model (alpha {self.distill_alpha:g}, "
                              f"T {self.distill_temperature:g})" for loss in self.losses)
        return (f"{self.model}{rows}: dense fine-tuning {self.dense_epochs:g} epochs at lr {self.dense_lr:g}, "
                f"batch {self.batch_size}, seed {self.dense_seed}; per seed in {list(self.seeds)}: CAHP selection "
                f"(B={self.resolution}, the engine's default sampling: stopping rules) at polynomial degrees "
                f"{list(self.degrees)}, salience top-k and seeded random at CAHP's head count; recovery "
                f"{self.recovery_epochs:g} epoch(s) at lr {self.recovery_lr:g} with {losses} (warm-up 10%, "
                "weight decay 0.01, clip 1.0, batch 32, seed = run seed); SST-5 test accuracy")


SMOKE = Protocol(name="quality_sst5_smoke", model="tiny-random-bert", dense_epochs=3, dense_lr=1e-3,
                 recovery_lr=1e-3, train_rows=400, test_rows=200)


# --------------------------------------------------------------------------- small pure helpers


def variant(strategy: str, loss: str) -> str:
    """The name a (strategy, loss) pair goes by in the summary: the strategy alone for cross-entropy."""
    return strategy if loss == "ce" else f"{strategy}+{loss}"


def label(name: str) -> str:
    strategy, _, loss = name.partition("+")
    return LABELS[strategy] + (f" + {loss}" if loss else "")


def jaccard(a: set[tuple[int, int]], b: set[tuple[int, int]]) -> float:
    union = a | b
    return len(a & b) / len(union) if union else 1.0


def pairwise_jaccard(sets: list[set[tuple[int, int]]]) -> dict[str, Any]:
    """Mean, min and max of the Jaccard similarity over every pair of kept-head sets."""
    pairs = [jaccard(a, b) for a, b in itertools.combinations(sets, 2)]
    if not pairs:
        return {"mean": None, "min": None, "max": None, "pairs": []}
    return {"mean": statistics.fmean(pairs), "min": min(pairs), "max": max(pairs), "pairs": pairs}


def _heads(selection: Selection) -> list[list[int]]:
    return [[int(layer), int(head)] for layer, head in zip(*np.nonzero(selection.kept_mask), strict=True)]


def _write_json(path: Path, doc: Any) -> None:
    """Write through a temporary file and a rename, so an interrupted run never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


# --------------------------------------------------------------------------- the protocol's steps


def tiny_base_model(directory: Path) -> str:
    """A random 3x4-head BERT (hidden 64) with all-MiniLM-L6-v2's tokenizer, for the smoke run."""
    if not (directory / "config.json").is_file():
        tokenizer = tf.AutoTokenizer.from_pretrained(minilm_path())
        torch.manual_seed(0)
        config = tf.BertConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                               intermediate_size=128, max_position_embeddings=512)
        config.num_labels = 5
        save_pruned(tf.BertForSequenceClassification(config).eval(), tokenizer, directory)
    return str(directory)


def load_data(data_dir: Path, tokenizer: Any, protocol: Protocol,
              options: DatasetOptions | None = None) -> tuple[EncodedDataset, EncodedDataset]:
    """The training and test splits, tokenised (SST-5's layout unless ``options`` names other columns and
    splits, e.g. MNLI's premise, hypothesis and ``validation_matched``)."""
    splits = load_splits(data_dir, options or DatasetOptions(eval_split="test"))

    def rows(texts: LabelledTexts, count: int | None) -> LabelledTexts:
        return texts if count is None else texts.subset(draw_subset(len(texts), count, seed=0, labels=texts.labels))

    return (encode(tokenizer, rows(splits.train, protocol.train_rows), max_length=512),
            encode(tokenizer, rows(splits.eval, protocol.test_rows), max_length=512))


#: The dense fine-tuning's CPU code path with ``dense_cpu_path="pinned"``: ATen's scalar kernels, MKL's
#: conditional-reproducibility mode and oneDNN at SSE4.1, one thread (the golden run's pins). The model
#: weights are never committed (90 MiB) and a new session may get another processor: a model trained on the
#: native path of an AVX2 machine was not reproduced on an AVX-512 one, natively or with AVX2 pins. About
#: twice as slow as the native path, once per machine.
DENSE_PINS = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "SSE41",
              "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _on_pinned_path() -> bool:
    return all(os.environ.get(k) == v for k, v in DENSE_PINS.items())


def _train_dense_in_pinned_child(base: str, data_dir: Path, cache: Path, protocol: Protocol,
                                 options: DatasetOptions | None = None) -> None:
    """Train (or reproduce) the dense model in a child process whose CPU code path is pinned before torch
    loads; the pins cannot be set in a process that already has torch."""
    job = json.dumps({"base": base, "data_dir": str(data_dir), "cache": str(cache), "protocol": asdict(protocol),
                      "options": None if options is None else asdict(options)})
    code = "import sys; from studies.quality import _dense_child; _dense_child(sys.argv[1])"
    env = {**os.environ, **DENSE_PINS}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                      os.environ.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", code, job], env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the dense fine-tuning on the pinned CPU path failed (exit {done.returncode}); "
                         "see its output above")


def _dense_child(job_json: str) -> None:
    """Entry point of the pinned child: train or reproduce the dense model into the cache, then exit."""
    job = json.loads(job_json)
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in job["protocol"].items()}
    common.pin_threads(1)

    def say(line: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] (pinned CPU path) {line}", flush=True)

    options = None if job.get("options") is None else DatasetOptions(**job["options"])
    dense_model(job["base"], Path(job["data_dir"]), Path(job["cache"]), Protocol(**fields), torch.device("cpu"), say,
                options=options)


def dense_model(base: str, data_dir: Path, cache: Path, protocol: Protocol, device: torch.device,
                say: Callable[[str], None],
                options: DatasetOptions | None = None) -> tuple[nn.Module, Any, dict[str, Any]]:
    """The densely fine-tuned model, its tokenizer and its record (recipe, training, test scores).

    Trained once and saved under ``cache/dense``; later runs load it. A cached record whose model files
    are gone (another session, another machine) is reproduced and checked against the record.
    """
    directory, record_file = cache / "dense", cache / "dense.json"
    record = _read_json(record_file)
    missing = record is None or not (directory / "config.json").is_file()
    if missing and protocol.dense_cpu_path == "pinned" and device.type == "cpu" and not _on_pinned_path():
        say("dense model: trained in a child process on the pinned CPU path (reproducible on any x86-64 machine)")
        _train_dense_in_pinned_child(base, data_dir, cache, protocol, options)
        record, missing = _read_json(record_file), False
    if missing:
        labels = len(load_splits(data_dir, options or DatasetOptions(eval_split="test")).train.label_names)
        loaded = load_classifier(base, num_labels=labels, seed=protocol.dense_seed)
        train, test = load_data(data_dir, loaded.tokenizer, protocol, options)
        say(f"dense fine-tuning: {protocol.dense_epochs:g} epochs at lr {protocol.dense_lr:g} on {len(train)} rows"
            + ("" if record is None else " (the model is not in the cache: retrained to resume its cells)"))
        training = finetune(loaded.model, train, TrainingRecipe(
            epochs=protocol.dense_epochs, lr=protocol.dense_lr, batch_size=protocol.batch_size, warmup_ratio=0.1,
            weight_decay=0.01, max_grad_norm=1.0, seed=protocol.dense_seed, device=device))
        metrics = evaluate(loaded.model, test, batch_size=protocol.batch_size, device=device)
        if record is not None and record["test"]["confusion"] != metrics.to_dict()["confusion"]:
            # The cached cells were scored against another dense model: mixing them would compare
            # pruned models of two different teachers.
            raise SystemExit(
                f"the dense model retrained here (test accuracy {metrics.accuracy:.4f}) is not the one the cached "
                f"cells were computed from ({record['test']['accuracy']:.4f}; trained on "
                f"{record.get('trained_on', 'an unrecorded machine')}): CPU training reproduces only on the same "
                "code path and thread count; pass --fresh or choose another --cache-dir")
        save_pruned(loaded.model, loaded.tokenizer, directory)
        if record is None:
            machine = common.machine()
            record = {"key": protocol.dense_key(), "training": training.to_dict(), "test": metrics.to_dict(),
                      "trained_on": {k: machine[k] for k in ("cpu", "vector_isa", "torch_threads", "cpu_path")}}
            _write_json(record_file, record)
        else:
            say(f"dense model reproduced: the same test confusion matrix as the cached record ({metrics.accuracy:.4f})")
    loaded = load_classifier(str(directory), device=device)
    return loaded.model.eval(), loaded.tokenizer, record


def selections_for_seed(dense: nn.Module, train: EncodedDataset, protocol: Protocol, seed: int) -> dict[str, Any]:
    """One head analysis at ``seed``; per degree, CAHP at that degree's knee and both baselines at its count.

    The choices are :func:`cahp_engine.selection.choose`, what ``cahp prune --strategy`` runs.
    """
    degrees = tuple(sorted(set(REPORTED_DEGREES) | set(protocol.degrees)))
    config = PruningConfig(poly_degree=protocol.degrees[0], resolution=protocol.resolution, seed=seed,
                           batch_size=protocol.batch_size, reported_degrees=degrees)
    analysis = analyze_heads(dense, train, config)
    per_degree: dict[str, Any] = {}
    for degree in protocol.degrees:
        knee = analysis.knees[degree]
        chosen = {name: choose(analysis, knee.k, name, seed=seed) for name in STRATEGIES}
        cahp = chosen["cahp"]
        per_degree[str(degree)] = {
            "k_star": knee.k, "knee_found": knee.found, "heads_kept": cahp.num_kept,
            "retention": cahp.retention,
            "layer_safety_added": [list(h) for h in cahp.layer_safety_added],
            "kept": {name: _heads(sel) for name, sel in chosen.items()},
            "stability": _stability(analysis, chosen, degree, seed),
        }
    return {
        "seed": seed, "shape": list(analysis.shape), "timings_s": analysis.timings,
        "warnings": list(analysis.warnings),
        "knees": {str(d): {"k": k.k, "found": k.found} for d, k in sorted(analysis.knees.items())},
        "mss_curve": {"ks": analysis.curve.ks.tolist(), "mss": analysis.curve.mss.tolist()},
        "salience": analysis.salience.tolist(), "degrees": per_degree,
    }


def _stability(analysis: HeadAnalysis, chosen: dict[str, Selection], degree: int, seed: int) -> dict[str, Any]:
    """Leave-one-shard-out stability of each strategy's choice (what ``selection.stability`` reports)."""
    out: dict[str, Any] = {}
    for name, selection in chosen.items():
        record = selection_stability(analysis, selection, strategy=name, poly_degree=degree, heads_to_keep=None,
                                     seed=seed)
        if record is not None:
            out[name] = {"mean_jaccard": record.mean_jaccard, "min_jaccard": record.min_jaccard,
                         "jaccard_to_selection": record.jaccard_to_selection, "k_stars": list(record.k_stars),
                         "heads_kept": list(record.heads_kept)}
    return out


def completed(found: dict[str, Any], dense: nn.Module, train: EncodedDataset, protocol: Protocol,
              seed: int) -> dict[str, Any]:
    """A cached selection that lacks a degree of ``protocol`` or the stability figures, completed: the
    analysis is redone (the same seed gives the same analysis) and must keep the cached heads."""
    degrees = tuple(sorted({int(d) for d in found["degrees"]} | set(protocol.degrees)))
    again = selections_for_seed(dense, train, replace(protocol, degrees=degrees), seed)
    for degree, info in found["degrees"].items():
        if again["degrees"][degree]["kept"] != info["kept"]:
            raise SystemExit(f"seed {seed}: the analysis no longer gives the cached selection; rerun with --fresh")
    return {**again, "wall_s": found.get("wall_s")}


def reconstruct_as_a_run(dense: nn.Module, pruned: nn.Module, train: EncodedDataset, seed: int,
                         device: torch.device, options: ReconstructionOptions | None = None) -> dict[str, Any]:
    """Reconstruct ``pruned`` in place against ``dense`` as a ``recovery: reconstruct+finetune`` run does (the
    run's options, or ``options``, and its calibration rows for ``seed``); its seconds, tokens, sentences
    and summary."""
    start = time.perf_counter()
    config = PruningConfig(seed=seed, device=device.type)
    batches = calibration_batches(train, config, device)
    refit = (reconstruct_pruned(dense, pruned, batches, config) if options is None
             else reconstruct(dense, pruned, batches, options, seed=seed))
    return {"seconds": time.perf_counter() - start, "tokens": refit.rows, "summary": refit.describe(),
            "sentences": min(config.reconstruction_rows, len(train))}


def teacher_for(dense: nn.Module, train: EncodedDataset, cache: Path, protocol: Protocol,
                device: torch.device, say: Callable[[str], None]) -> TeacherLogits:
    """The dense model's logits over the training rows: computed once, then read from the cache."""
    path, record_path = cache / "teacher-logits.npy", cache / "teacher.json"
    record = _read_json(record_path)
    if path.is_file() and record is not None:
        logits = np.load(path)
        if logits.shape[0] == len(train):
            return TeacherLogits(logits, TeacherRecord(**record))
    teacher = teacher_logits(dense, train, batch_size=protocol.batch_size, device=device)
    np.save(path, teacher.logits)
    _write_json(record_path, teacher.record.to_dict())
    say(f"teacher logits over {len(train)} rows in {teacher.record.seconds:.0f} s (cached)")
    return teacher


def run_cell(dense: nn.Module, train: EncodedDataset, test: EncodedDataset, heads: list[list[int]],
             protocol: Protocol, seed: int, device: torch.device, loss: str = "ce",
             teacher: TeacherLogits | None = None, auxiliary_loss: AuxiliaryLoss | None = None) -> dict[str, Any]:
    """Prune a copy of the dense model to ``heads``, score it, recover it (with ``loss``, plus
    ``auxiliary_loss`` when given: ``python -m studies distill-study``), score it again."""
    start = time.perf_counter()
    pruned = copy.deepcopy(dense)
    kept: dict[int, list[int]] = {layer: [] for layer in range(len(heads_per_layer(dense)))}
    for layer, head in heads:
        kept[layer].append(head)
    prune_heads(pruned, kept)
    before = None
    if protocol.score_before_recovery:
        before = evaluate(pruned, test, batch_size=protocol.batch_size, device=device).accuracy
    distillation = (Distillation(teacher, protocol.distill_alpha, protocol.distill_temperature)
                    if loss == "distill" and teacher is not None else None)
    recovery = finetune(pruned, train, TrainingRecipe(
        epochs=protocol.recovery_epochs, lr=protocol.recovery_lr, batch_size=protocol.batch_size, warmup_ratio=0.1,
        weight_decay=0.01, max_grad_norm=1.0, seed=seed, device=device, distillation=distillation,
        auxiliary_loss=auxiliary_loss))
    after = evaluate(pruned, test, batch_size=protocol.batch_size, device=device)
    return {"loss": loss, "accuracy": after.accuracy, "macro_f1": after.macro_f1, "recall": list(after.recall),
            "accuracy_before_recovery": before,
            "recovery": {"wall_s": recovery.wall_s, "loss_per_epoch": list(recovery.loss_per_epoch)},
            "wall_s": time.perf_counter() - start}


# --------------------------------------------------------------------------- the run, resumable


def _cell_key(seed: int, degree: int, strategy: str, loss: str = "ce") -> str:
    base = f"seed={seed}/degree={degree}/strategy={strategy}"
    return base if loss == "ce" else f"{base}/loss={loss}"


def store_cell(cells_path: Path, key: str, cell: dict[str, Any]) -> dict[str, Any]:
    """Add ``cell`` under ``key`` to the cells file and return every cell in it.

    The file is re-read and rewritten under an exclusive lock, so that several runs (one per seed,
    each a process of its own) can fill the same cache side by side without losing each other's cells.
    """
    with (cells_path.parent / (cells_path.name + ".lock")).open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cells: dict[str, Any] = _read_json(cells_path) or {}
        cells[key] = cell
        _write_json(cells_path, cells)
    return cells


def _check_manifest(cache: Path, protocol: Protocol) -> None:
    """Refuse a cache written under another dense recipe: its cells would not be comparable."""
    path = cache / "manifest.json"
    found = _read_json(path)
    wanted = json.loads(json.dumps(protocol.dense_key()))
    if found is None:
        _write_json(path, wanted)
    elif found != wanted:
        raise SystemExit(f"{cache} holds results of another protocol ({found}); delete that directory, "
                         "pass --fresh, or choose another --cache-dir")


def run(protocol: Protocol, *, base: str, data_dir: Path, cache: Path, device: torch.device, compute: bool = True,
        say: Callable[[str], None] = print) -> dict[str, Any]:
    """Run (or, with ``compute=False``, only collect) every cell of ``protocol``; return the payload."""
    start = time.perf_counter()
    cache.mkdir(parents=True, exist_ok=True)
    _check_manifest(cache, protocol)
    if compute:
        dense, tokenizer, record = dense_model(base, data_dir, cache, protocol, device, say)
        train, test = load_data(data_dir, tokenizer, protocol)
        say(f"dense test accuracy {record['test']['accuracy']:.4f} ({len(train)} train / {len(test)} test rows)")
    else:
        record = _read_json(cache / "dense.json")
        if record is None:
            raise SystemExit(f"{cache} holds no dense model yet; run without --report-only first")

    selections: dict[int, dict[str, Any]] = {}
    for seed in protocol.seeds:
        path = cache / f"selection-seed{seed}.json"
        found = _read_json(path)
        if found is None and compute:
            t = time.perf_counter()
            found = selections_for_seed(dense, train, protocol, seed)
            found["wall_s"] = time.perf_counter() - t
            _write_json(path, found)
            say(f"seed {seed}: selection in {found['wall_s']:.0f} s; " + ", ".join(
                f"degree {d}: k*={v['k_star']}, {v['heads_kept']} heads" for d, v in found["degrees"].items()))
        if found is not None and compute and (set(map(str, protocol.degrees)) - set(found["degrees"]) or any(
                "stability" not in v for v in found["degrees"].values())):
            found = completed(found, dense, train, protocol, seed)
            _write_json(path, found)
        if found is not None:
            selections[seed] = found

    cells_path = cache / protocol.cells_file()
    cells: dict[str, Any] = _read_json(cells_path) or {}
    todo = [(s, d, name, loss) for s in protocol.seeds for d in protocol.degrees
            for name, loss in protocol.variants()]
    teacher = None
    for i, (seed, degree, strategy, loss) in enumerate(todo, 1):
        key = _cell_key(seed, degree, strategy, loss)
        if key in cells or not compute:
            continue
        if loss == "distill" and teacher is None:
            teacher = teacher_for(dense, train, cache, protocol, device, say)
        info = selections[seed]["degrees"][str(degree)]
        cell = run_cell(dense, train, test, info["kept"][strategy], protocol, seed, device, loss, teacher)
        # At once, merged under a lock: an interrupted run resumes after this cell, and runs of other
        # seeds may share the cache.
        cells = store_cell(cells_path, key, {"seed": seed, "degree": degree, "strategy": strategy,
                                             "k_star": info["k_star"], "heads_kept": info["heads_kept"],
                                             "retention": info["retention"], **cell})
        unrecovered = cell["accuracy_before_recovery"]
        say(f"[{i}/{len(todo)}] seed {seed} degree {degree} {variant(strategy, loss):16s}: {info['heads_kept']} heads "
            f"({info['retention']:.1%}), accuracy {cell['accuracy']:.4f}"
            + ("" if unrecovered is None else f" (before recovery {unrecovered:.4f})")
            + f" in {cell['wall_s']:.0f} s")
    cells = _read_json(cells_path) or {}  # with the cells other runs added meanwhile
    return {
        "settings": asdict(protocol),
        "dense": record,
        "summary": summarise(cells, selections, protocol),
        "complete": all(_cell_key(*c) in cells for c in todo),
        "cells": [{"loss": "ce", **cells[_cell_key(*c)]} for c in todo if _cell_key(*c) in cells],
        "selections": {str(seed): sel for seed, sel in selections.items()},
        "public_implementation": PUBLIC,
        "paper_table1_bert_base_cahp": PAPER_BERT_BASE,
        "wall_s_this_invocation": time.perf_counter() - start,
    }


def record_invocation(cache: Path, protocol: Protocol, invocation: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Append ``invocation`` (a computing run) to the cache's log; return the runs of this recovery recipe."""
    path = cache / "invocations.json"
    log: list[dict[str, Any]] = _read_json(path) or []
    if invocation is not None:
        log.append({**invocation, "cells_file": protocol.cells_file()})
        _write_json(path, log)
    return [run for run in log if run.get("cells_file") == protocol.cells_file()]


def summarise(cells: dict[str, Any], selections: dict[int, dict[str, Any]], protocol: Protocol) -> dict[str, Any]:
    """Per degree and strategy: accuracy mean and sample std over the finished seeds, retention, k*
    and the pairwise Jaccard similarity of the kept-head sets across seeds."""
    out: dict[str, Any] = {}
    for degree in protocol.degrees:
        infos = [sel["degrees"][str(degree)] for sel in selections.values() if str(degree) in sel["degrees"]]
        for strategy, loss in protocol.variants():
            rows = [cells[k] for s in protocol.seeds if (k := _cell_key(s, degree, strategy, loss)) in cells]
            acc = [r["accuracy"] for r in rows]
            unrecovered = [r["accuracy_before_recovery"] for r in rows if r["accuracy_before_recovery"] is not None]
            sets = [{(h[0], h[1]) for h in info["kept"][strategy]} for info in infos]
            out.setdefault(str(degree), {})[variant(strategy, loss)] = {
                "seeds": [r["seed"] for r in rows],
                "accuracies": acc,
                "accuracy_mean": statistics.fmean(acc) if acc else None,
                "accuracy_std": statistics.stdev(acc) if len(acc) > 1 else None,
                "accuracy_before_recovery_mean": statistics.fmean(unrecovered) if unrecovered else None,
                "macro_f1_mean": statistics.fmean(r["macro_f1"] for r in rows) if rows else None,
                "macro_f1_std": statistics.stdev(r["macro_f1"] for r in rows) if len(rows) > 1 else None,
                "retention_mean": statistics.fmean(i["retention"] for i in infos) if infos else None,
                "heads_kept_mean": statistics.fmean(i["heads_kept"] for i in infos) if infos else None,
                "k_star_mean": statistics.fmean(i["k_star"] for i in infos) if infos else None,
                "jaccard": pairwise_jaccard(sets),
                "leave_one_shard_out_jaccard": [i["stability"][strategy]["mean_jaccard"] for i in infos
                                                if strategy in i.get("stability", {})],
            }
    return out


# --------------------------------------------------------------------------- the table and the plot


def _pct(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{100 * value:.{digits}f}"


def _mean_std(mean: float | None, std: float | None) -> str:
    return _pct(mean) + ("" if std is None else f" ± {_pct(std)}")


def _provenance(doc: dict[str, Any]) -> str:
    """For a report rebuilt with --report-only: which runs computed its figures."""
    if not (doc.get("report_rebuilt_by") and doc.get("computed_by")):
        return ""
    runs = "; ".join(f"`{r['command']}` on {r['date']} in {r['wall_s'] / 60:.0f} min{_on_machine(r)}"
                     for r in doc["computed_by"])
    return f" (this report rebuilt by `{doc['report_rebuilt_by']}`; computed by {runs})"


def _on_machine(run: dict[str, Any]) -> str:
    m = run.get("machine")
    if m is None:
        return ""
    pins = " ".join(f"{k}={v}" for k, v in m.get("cpu_path", {}).items())
    isa = "/".join(m.get("vector_isa", [])) or "no vector flags"
    return f" ({m['torch_threads']} torch threads, {isa}{', ' + pins if pins else ''})"


def markdown(doc: dict[str, Any]) -> str:
    """A Table I-shaped summary: methods as rows, polynomial degrees as columns."""
    settings, summary = doc["settings"], doc["summary"]
    degrees = [str(d) for d in settings["degrees"]]
    public = doc["public_implementation"]
    show_public = settings["model"] == PUBLIC_MODEL  # its figures say nothing about another model
    names = list(summary[degrees[0]]) if degrees else []
    n_seeds = max((len(summary[d][s]["seeds"]) for d in degrees for s in names), default=0)
    head = "| Method | " + " | ".join(f"Poly {d}" for d in degrees) + " |\n|---|" + "---|" * len(degrees) + "\n"
    lines = [
        f"# SST-5 quality: CAHP against salience top-k and random choice ({settings['model']})", "",
        f"Date {doc['date']}; command `{doc['command']}`{_provenance(doc)}; machine {doc['machine']['cpu']} "
        f"({doc['machine']['cores']} cores"
        # A rebuilt report's own thread count says nothing about the runs that computed it.
        + ("" if doc.get("report_rebuilt_by") else f", {doc['machine']['torch_threads']} torch threads")
        + f"{', GPU ' + doc['machine']['gpu'] if doc['machine']['gpu'] else ''}).", "",
        f"Protocol: {doc['protocol']}.", "",
        f"Dense test accuracy: **{_pct(doc['dense']['test']['accuracy'])}%**"
        + (f" (public implementation: {_pct(public['dense_accuracy'])}%)." if show_public else ".")
        + ("" if doc["complete"] else " **Run incomplete.**"), "",
        f"Test accuracy (%), mean ± std over {n_seeds} seed(s); subscript: mean share of heads kept "
        "(the same for the three methods, which keep the same number of heads).", "", head.rstrip("\n"),
    ]
    for strategy in names:
        cells = []
        for d in degrees:
            row = summary[d][strategy]
            share = f"<sub>{_pct(row['retention_mean'])}%</sub>"
            cells.append(_mean_std(row["accuracy_mean"], row["accuracy_std"]) + share)
        lines.append(f"| {label(strategy)} | " + " | ".join(cells) + " |")
    ref = [public["degrees"].get(d) for d in degrees]
    if show_public:
        lines.append("| Public CAHP (seed 42) | " + " | ".join(
            "–" if r is None else f"{_pct(r['accuracy'])}<sub>{_pct(r['retention'])}%</sub>" for r in ref) + " |")
    lines += ["", "Mean k* (clusters at the knee) and heads kept (k* plus layer-safety heads): " + "; ".join(
        f"Poly {d}: k* {summary[d][names[0]]['k_star_mean'] or 0:.1f}, "
        f"{summary[d][names[0]]['heads_kept_mean'] or 0:.1f}"
        " heads" for d in degrees) + ".", "",
        "Accuracy (%) straight after pruning, before recovery, mean over seeds:", "", head.rstrip("\n")]
    for strategy in names[:len(STRATEGIES)]:  # before recovery the loss makes no difference
        lines.append(f"| {LABELS[strategy.partition('+')[0]]} | " + " | ".join(
            _pct(summary[d][strategy]["accuracy_before_recovery_mean"]) for d in degrees) + " |")
    lines += ["", "Macro-F1 (%) after recovery, mean ± std over seeds (a model that stops predicting a class "
              "loses here more than in accuracy):", "", head.rstrip("\n")]
    for strategy in names:
        lines.append(f"| {label(strategy)} | " + " | ".join(
            _mean_std(summary[d][strategy]["macro_f1_mean"], summary[d][strategy].get("macro_f1_std"))
            for d in degrees) + " |")
    lines += ["", "Jaccard similarity of the kept heads across seeds (mean over pairs, min–max):", "",
              head.rstrip("\n")]
    for strategy in names[:len(STRATEGIES)]:  # the kept heads do not depend on the loss
        cells = []
        for d in degrees:
            j = summary[d][strategy]["jaccard"]
            cells.append("–" if j["mean"] is None else f"{j['mean']:.2f} ({j['min']:.2f}–{j['max']:.2f})")
        lines.append(f"| {LABELS[strategy.partition('+')[0]]} | " + " | ".join(cells) + " |")
    if show_public:
        lines.append("| Public CAHP | " + " | ".join(
            "–" if r is None else f"{r['jaccard'][0]:.2f}–{r['jaccard'][1]:.2f}" for r in ref) + " |")
    lines += ["", "Leave-one-shard-out stability (mean pairwise Jaccard of the 5 selections made without one "
              "fifth of the sampled rows; mean over seeds, min–max; random choice depends on the rows only through "
              "each rerun's head count):", "", head.rstrip("\n")]
    for strategy in names[:len(STRATEGIES)]:
        cells = []
        for d in degrees:
            loo = summary[d][strategy].get("leave_one_shard_out_jaccard") or []
            cells.append(f"{statistics.fmean(loo):.2f} ({min(loo):.2f}–{max(loo):.2f})" if loo else "–")
        lines.append(f"| {LABELS[strategy.partition('+')[0]]} | " + " | ".join(cells) + " |")
    lines += ["", "Per seed (test accuracy %, after recovery):", "",
              "| Seed | Degree | k* | Heads kept | " + " | ".join(label(n) for n in names) + " |",
              "|---|---|---|---|" + "---|" * len(names)]
    by_key = {(c["seed"], c["degree"], variant(c["strategy"], c.get("loss", "ce"))): c for c in doc["cells"]}
    for seed, sel in doc["selections"].items():
        for d in degrees:
            if d not in sel["degrees"]:
                continue
            info = sel["degrees"][d]
            accs = [_pct(by_key[(int(seed), int(d), s)]["accuracy"]) if (int(seed), int(d), s) in by_key else "–"
                    for s in names]
            lines.append(f"| {seed} | {d} | {info['k_star']} | {info['heads_kept']} | " + " | ".join(accs) + " |")
    return "\n".join(lines) + "\n"


def plot(doc: dict[str, Any], path: Path) -> None:
    """Test accuracy against the share of heads kept, per method, with the dense and public figures."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    colours = {"cahp": "#d7191c", "salience": "#2b83ba", "random": "#7f7f7f"}
    degrees = [str(d) for d in doc["settings"]["degrees"]]
    names = list(doc["summary"][degrees[0]]) if degrees else []
    offsets = {name: 0.4 * (i - (len(names) - 1) / 2) for i, name in enumerate(names)}
    for strategy in names:
        offset, base = offsets[strategy], strategy.partition("+")[0]
        xs, ys, errs = [], [], []
        for d in degrees:
            row = doc["summary"][d][strategy]
            if row["accuracy_mean"] is None:
                continue
            xs.append(100 * row["retention_mean"] + offset)
            ys.append(100 * row["accuracy_mean"])
            errs.append(100 * (row["accuracy_std"] or 0.0))
        seeds = [c for c in doc["cells"] if variant(c["strategy"], c.get("loss", "ce")) == strategy]
        ax.scatter([100 * c["retention"] + offset for c in seeds], [100 * c["accuracy"] for c in seeds], s=10,
                   color=colours[base], alpha=0.35)
        ax.errorbar(xs, ys, yerr=errs, marker="o" if base == strategy else "s", capsize=3, color=colours[base],
                    linestyle="-" if base == strategy else "--", label=label(strategy))
    ax.axhline(100 * doc["dense"]["test"]["accuracy"], color="black", linestyle="--", linewidth=1, label="dense")
    public = doc["public_implementation"]
    if doc["settings"]["model"] == PUBLIC_MODEL:
        ref = [public["degrees"][d] for d in degrees if d in public["degrees"]]
        ax.scatter([100 * r["retention"] for r in ref], [100 * r["accuracy"] for r in ref], marker="*", s=120,
                   facecolor="none", edgecolor="black", label="public CAHP (seed 42)")
        ax.axhline(100 * public["dense_accuracy"], color="black", linestyle=":", linewidth=1, label="public dense")
    for d in degrees:
        row = doc["summary"][d][names[0]]
        if row["retention_mean"] is not None:
            ax.annotate(f"Poly {d}", (100 * row["retention_mean"], 0.0), xycoords=("data", "axes fraction"),
                        textcoords="offset points", xytext=(0, 4), ha="center", fontsize=8)
    ax.set_xlabel("heads kept (%)")
    ax.set_ylabel("SST-5 test accuracy (%)")
    ax.set_title(f"{doc['settings']['model']}: accuracy against retention")
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110)


# --------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m studies quality")
    p.add_argument("--threads", type=int, help="torch threads (default 2, 1 with --smoke); use 1 when another "
                   "job shares the 2 cores: two threads then run several times slower than one")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--paper-protocol", action="store_true",
                   help="the paper's recovery (3 epochs at lr 2e-5): for a GPU; results in quality_sst5_paper.*")
    p.add_argument("--smoke", action="store_true",
                   help="the whole protocol on a tiny random model and a few hundred SST-5 rows (about a minute)")
    p.add_argument("--seeds", help="comma-separated (default 42,43,44)")
    p.add_argument("--degrees", help="comma-separated polynomial degrees (default 2,6)")
    p.add_argument("--data", type=Path, default=common.SST5, help="SST-5 directory (train.csv, test.csv)")
    p.add_argument("--cache-dir", type=Path, help="default studies/results/cache/<name> (not tracked by git)")
    p.add_argument("--fresh", action="store_true", help="delete the cache first (dense model, selections, cells)")
    p.add_argument("--report-only", action="store_true", help="write the result files from the cache; compute nothing")
    p.add_argument("--losses", default="ce",
                   help="comma-separated recovery losses, each a full set of cells: ce, distill (default ce)")
    p.add_argument("--no-before-recovery", action="store_true",
                   help="skip scoring each pruned model before its recovery (saves one test pass per cell)")
    args = p.parse_args(argv)
    threads = args.threads or (1 if args.smoke else 2)
    common.pin_threads(threads)

    protocol = SMOKE if args.smoke else Protocol()
    cache = args.cache_dir or common.RESULTS / "cache" / protocol.name
    if args.paper_protocol:
        protocol = replace(protocol, name=protocol.name + "_paper", recovery_epochs=3.0)
    if args.seeds:
        protocol = replace(protocol, seeds=tuple(int(v) for v in args.seeds.split(",") if v))
    if args.degrees:
        protocol = replace(protocol, degrees=tuple(int(v) for v in args.degrees.split(",") if v))
    if args.no_before_recovery:
        protocol = replace(protocol, score_before_recovery=False)
    losses = tuple(v for v in args.losses.split(",") if v)
    if not losses or set(losses) - {"ce", "distill"}:
        raise SystemExit(f"--losses takes ce and/or distill, comma-separated, got {args.losses!r}")
    protocol = replace(protocol, losses=losses)
    if args.fresh:
        if args.report_only:
            raise SystemExit("--fresh and --report-only contradict each other")
        import shutil

        shutil.rmtree(cache, ignore_errors=True)
    base = tiny_base_model(cache / "base") if args.smoke else minilm_path()
    device = resolve_device(args.device)
    print(f"protocol: {protocol.describe()}\ncache: {cache}; device {device}; {threads} torch thread(s)",
          flush=True)

    def say(line: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)

    payload = run(protocol, base=base, data_dir=args.data, cache=cache, device=device,
                  compute=not args.report_only, say=say)
    cmd = ("python -m studies quality " + " ".join(argv or [])).strip()
    this_run = {"command": cmd, "date": datetime.now(UTC).isoformat(timespec="seconds"),
                "wall_s": payload["wall_s_this_invocation"], "machine": common.machine()}
    runs = record_invocation(cache, protocol, None if args.report_only else this_run)
    payload["computed_by"] = runs
    if args.report_only:
        payload["report_rebuilt_by"] = cmd
    # The figures come from the invocations that computed them; a --report-only rebuild names them.
    command = runs[-1]["command"] if args.report_only and runs else cmd
    path = common.save(f"{protocol.name}.json", payload, command=command, protocol=protocol.describe())
    doc = json.loads(path.read_text())
    (common.RESULTS / f"{protocol.name}.md").write_text(markdown(doc))
    plot(doc, common.RESULTS / f"{protocol.name}.png")
    print(markdown(doc))
    print(f"saved {path} and its .md and .png")
