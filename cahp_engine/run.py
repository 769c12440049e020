"""A whole pruning run: load, (dense fine-tune), select, prune, recover, evaluate, write artifacts.

This is what ``cahp prune`` and the job service's worker call. Everything goes to a temporary
sibling directory that is renamed to ``output_dir`` only when the run succeeded, so an interrupted
or failed run never leaves something that looks like a result.
"""

from __future__ import annotations

import copy
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cahp_engine.analysis import validate_inputs
from cahp_engine.checkpoint import load_pruned, save_pruned
from cahp_engine.config import PruningConfig
from cahp_engine.data import EncodedDataset, encode
from cahp_engine.datasets_io import DatasetOptions, DatasetSplits, load_splits
from cahp_engine.errors import InvalidInputError, PipelineError
from cahp_engine.evaluation import as_device, compare_speed, count_parameters, evaluate
from cahp_engine.models import load_classifier
from cahp_engine.pipeline import SelectionResult, select_heads
from cahp_engine.plots import plot_head_map, plot_layer_retention, plot_mss_curve
from cahp_engine.progress import Monitor
from cahp_engine.surgery import prune_heads
from cahp_engine.training import TrainingResult, finetune

#: Files written next to ``model/``.
ARTIFACT_FILES: tuple[str, ...] = (
    "mss_curve.json",
    "mss_curve.png",
    "head_map.json",
    "head_map.png",
    "layer_retention.png",
    "report.json",
)

#: Share of the whole run each stage takes, roughly, for the overall progress fraction.
_STAGE_SPAN: dict[str, tuple[float, float]] = {
    "load": (0.00, 0.02),
    "dense_finetune": (0.02, 0.25),
    "dense_evaluation": (0.25, 0.28),
    "signatures": (0.28, 0.40),
    "separation": (0.40, 0.41),
    "graph_space": (0.41, 0.42),
    "sweep": (0.42, 0.43),
    "knee": (0.43, 0.435),
    "salience": (0.435, 0.50),
    "selection": (0.50, 0.505),
    "surgery": (0.505, 0.51),
    "recovery": (0.51, 0.88),
    "evaluation": (0.88, 0.97),
    "artifacts": (0.97, 1.00),
}

_VERSIONED = ("torch", "transformers", "scikit-learn", "kmedoids", "kneed", "numpy", "safetensors", "cahp")


def resolve_device(device: str) -> torch.device:
    """``auto`` -> the first CUDA device when there is one, else the CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return as_device(device)


def prepare_output_dir(output_dir: Path, *, overwrite: bool) -> None:
    """Refuse an existing non-empty directory unless ``overwrite``; never touch it otherwise."""
    if output_dir.exists() and not output_dir.is_dir():
        raise InvalidInputError(f"output {str(output_dir)!r} exists and is a file; name a directory")
    if output_dir.is_dir() and any(output_dir.iterdir()) and not overwrite:
        raise InvalidInputError(
            f"output directory {str(output_dir)!r} exists and is not empty; choose another or pass --overwrite"
        )


def run_pruning(
    model_ref: str,
    dataset_ref: str,
    output_dir: Path | str,
    config: PruningConfig,
    *,
    dataset_options: DatasetOptions | None = None,
    revision: str | None = None,
    hub_token: str | None = None,
    cache_dir: str | None = None,
    overwrite: bool = False,
    model_name: str | None = None,
    dataset_name: str | None = None,
    progress: Callable[[str, float], None] | None = None,
    should_cancel: Callable[[], bool] | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Prune ``model_ref`` on ``dataset_ref`` and write the artifacts to ``output_dir``.

    Parameters
    ----------
    model_ref : str
        A local model directory or a hub id.
    dataset_ref : str
        A local dataset directory or a hub dataset id (see :func:`~cahp_engine.datasets_io.load_splits`).
    output_dir : path
        Must not exist or be empty (unless ``overwrite``). Receives ``model/`` and :data:`ARTIFACT_FILES`.
    config : PruningConfig
    dataset_options : DatasetOptions, optional
    revision, hub_token, cache_dir : optional
        Hub access for model and dataset.
    overwrite : bool
        Replace a non-empty ``output_dir`` (only once the run has succeeded).
    model_name, dataset_name : str, optional
        How the report and the log name the model and the dataset (default: ``model_ref`` and
        ``dataset_ref``). The job service passes the job's URIs, so no worker path reaches a caller.
    progress : callable(stage, overall_fraction), optional
    should_cancel : callable() -> bool, optional
        Polled between steps; True raises :class:`~cahp_engine.errors.JobCancelledError`.
    log : callable(str), optional
        Receives human-readable lines about what the run is doing.

    Returns
    -------
    dict
        The content of ``report.json``; ``report["summary"]`` holds the headline figures.
    """
    started = time.perf_counter()
    out = Path(output_dir).expanduser().resolve()
    prepare_output_dir(out, overwrite=overwrite)
    say = log or (lambda _line: None)

    def overall(stage: str, fraction: float) -> None:
        if progress is not None:
            lo, hi = _STAGE_SPAN.get(stage, (0.0, 1.0))
            progress(stage, lo + (hi - lo) * fraction)

    monitor = Monitor(overall, should_cancel)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        report = _run(model_ref, dataset_ref, work, config, dataset_options or DatasetOptions(), revision,
                      hub_token, cache_dir, monitor, say, overall, should_cancel,
                      names=(model_name or model_ref, dataset_name or dataset_ref))
        report["wall_time_s"] = time.perf_counter() - started
        _write_json(work / "report.json", report)
        if out.exists():
            shutil.rmtree(out)
        os.replace(work, out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    overall("artifacts", 1.0)
    say(f"done: artifacts in {out}")
    return report


def _run(
    model_ref: str,
    dataset_ref: str,
    work: Path,
    config: PruningConfig,
    options: DatasetOptions,
    revision: str | None,
    hub_token: str | None,
    cache_dir: str | None,
    monitor: Monitor,
    say: Callable[[str], None],
    overall: Callable[[str, float], None],
    should_cancel: Callable[[], bool] | None,
    *,
    names: tuple[str, str],
) -> dict[str, Any]:
    device = resolve_device(config.device)
    model_name, dataset_name = names
    warnings: list[str] = []
    with monitor.stage("load"):
        say(f"reading dataset {dataset_name}")
        splits = load_splits(dataset_ref, options, revision=None, cache_dir=cache_dir, token=hub_token)
        say(f"loading model {model_name}" + (f" at revision {revision}" if revision else ""))
        loaded = load_classifier(model_ref, revision=revision, num_labels=len(splits.label_names),
                                 cache_dir=cache_dir, token=hub_token, device=device)
        model, tokenizer = loaded.model, loaded.tokenizer
        model.to(device).eval()
        train = encode(tokenizer, splits.train, max_length=config.max_length)
        evaluation = encode(tokenizer, splits.eval, max_length=config.max_length)
        validate_inputs(model, train, config)
        say(f"{len(train)} training and {len(evaluation)} evaluation samples, {train.num_classes} classes; "
            f"{loaded.family} model with {loaded.num_layers}x{loaded.num_heads} heads on {device}")

    dense_ran, dense_reason = _dense_decision(config.dense_finetune, loaded.classifier_trained)
    if config.dense_finetune == "never" and not loaded.classifier_trained:
        warnings.append("the model's classifier head is untrained and dense fine-tuning is off; "
                        "selection will profile an untrained classifier")
    dense_training = None
    if dense_ran:
        with monitor.stage("dense_finetune"):
            say(f"dense fine-tuning ({dense_reason}): {config.dense_epochs} epochs at lr {config.dense_lr}")
            dense_training = _finetune(model, train, config, config.dense_epochs, config.dense_lr, device,
                                       "dense_finetune", overall, should_cancel)
    with monitor.stage("dense_evaluation"):
        dense_metrics = evaluate(model, evaluation, batch_size=config.batch_size, device=device)
        say(f"dense accuracy {dense_metrics.accuracy:.4f}, macro-F1 {dense_metrics.macro_f1:.4f}")

    say("selecting heads")
    result = select_heads(model, train, config, progress=monitor.report, should_cancel=should_cancel)
    monitor.timings.update(result.timings)
    warnings.extend(result.warnings)
    sel = result.selection
    say(f"k* = {result.k_star}; keeping {sel.num_kept} of {sel.kept_mask.size} heads ({sel.retention:.1%})")

    with monitor.stage("surgery"):
        dense_params = count_parameters(model)
        pruned = copy.deepcopy(model)
        prune_heads(pruned, sel.kept)
        pruned.eval()
        pruned_params = count_parameters(pruned)
    with monitor.stage("evaluation"):
        before = evaluate(pruned, evaluation, batch_size=config.batch_size, device=device)
    say(f"pruned accuracy before recovery {before.accuracy:.4f}")
    with monitor.stage("recovery"):
        say(f"recovery fine-tuning: {config.epochs} epochs at lr {config.lr}")
        recovery = _finetune(pruned, train, config, config.epochs, config.lr, device, "recovery", overall,
                             should_cancel)
    with monitor.stage("evaluation"):
        after = evaluate(pruned, evaluation, batch_size=config.batch_size, device=device)
        say(f"pruned accuracy after recovery {after.accuracy:.4f}")
        seq_len = int(min(64, max(8, np.percentile(evaluation.lengths, 95))))
        speed = compare_speed(model, pruned, batch_sizes=(1, 32), seq_len=seq_len, device=device,
                              warmup=config.latency_warmup, repeats=config.latency_repeats, seed=config.seed)
    with monitor.stage("artifacts"):
        save_pruned(pruned, tokenizer, work / "model")
        verified_diff = _verify_checkpoint(pruned, work / "model", evaluation, device)
        _write_curve(work, result, config)
        _write_head_map(work, result)

    speedups = {row["batch_size"]: row["speedup"] for row in speed["results"]}
    heads_total = int(sel.kept_mask.size)
    summary = {
        "k_star": result.k_star,
        "heads_total": heads_total,
        "heads_kept": sel.num_kept,
        "retention": sel.retention,
        "dense_accuracy": dense_metrics.accuracy,
        "pruned_accuracy": after.accuracy,
        "speedup": speedups.get(32, next(iter(speedups.values()), None)),
    }
    return {
        "format_version": 1,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "summary": summary,
        "model": {"ref": model_name, "revision": revision, "family": loaded.family,
                  "layers": loaded.num_layers, "heads_per_layer": loaded.num_heads,
                  "classifier_trained": loaded.classifier_trained},
        "dataset": _dataset_record(dataset_name, splits, options, len(train), len(evaluation),
                                   local=dataset_name == dataset_ref),
        "config": config.to_dict(),
        "seed": config.seed,
        "device": str(device),
        "environment": _environment(),
        "dense_finetune": {"mode": config.dense_finetune, "ran": dense_ran, "reason": dense_reason,
                           "training": dense_training.to_dict() if dense_training else None},
        "selection": {
            "strategy": sel.strategy,
            "k_star": result.k_star,
            "poly_degree": config.poly_degree,
            "knee_found": result.knee.found if result.knee else None,
            "knees_by_degree": {str(d): k.k for d, k in sorted(result.knees.items())},
            "heads_total": heads_total,
            "heads_kept": sel.num_kept,
            "retention": sel.retention,
            "kept": {str(layer): heads for layer, heads in sel.kept.items()},
            "layer_safety_added": [list(h) for h in sel.layer_safety_added],
            "resolution": result.resolution,
            "signature_samples": result.signature_samples,
            "calibration_samples": result.calibration_samples,
        },
        "metrics": {"dense": dense_metrics.to_dict(), "pruned_before_recovery": before.to_dict(),
                    "pruned": after.to_dict()},
        "parameters": {"dense": dense_params.to_dict(), "pruned": pruned_params.to_dict()},
        "speed": speed,
        "recovery": recovery.to_dict(),
        "checkpoint": {"path": "model", "format": "safetensors", "max_abs_logit_diff_after_reload": verified_diff},
        "timings_s": dict(monitor.timings),
        "warnings": warnings,
    }


def _finetune(
    model: torch.nn.Module,
    train: EncodedDataset,
    config: PruningConfig,
    epochs: float,
    lr: float,
    device: torch.device,
    stage: str,
    overall: Callable[[str, float], None],
    should_cancel: Callable[[], bool] | None,
) -> TrainingResult:
    """The shared recipe (batch, warm-up, decay, clipping, seed) with a stage's epochs and rate."""
    return finetune(
        model, train, epochs=epochs, lr=lr, batch_size=config.batch_size, warmup_ratio=config.warmup_ratio,
        weight_decay=config.weight_decay, max_grad_norm=config.max_grad_norm, seed=config.seed, device=device,
        progress=lambda step, total: overall(stage, step / max(total, 1)), should_cancel=should_cancel,
    )


def _dense_decision(mode: str, classifier_trained: bool) -> tuple[bool, str]:
    if mode == "always":
        return True, "requested (--dense-finetune always)"
    if mode == "never":
        return False, "turned off (--dense-finetune never)"
    if classifier_trained:
        return False, "the model has a trained classification head for these labels"
    return True, "the model has no trained classification head for the dataset's labels"


def _verify_checkpoint(model: torch.nn.Module, path: Path, data: Any, device: torch.device) -> float:
    """Reload the saved checkpoint and compare its logits with the in-memory model's."""
    from cahp_engine.data import collate

    reloaded = load_pruned(path, device=device)
    batch = collate(data, np.arange(min(len(data), 8)))
    inputs = {k: v.to(device) for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        diff = float((model(**inputs).logits - reloaded(**inputs).logits).abs().max())
    if not diff <= 1e-4:
        raise PipelineError(f"the saved checkpoint does not reproduce the model (max logit difference {diff:g})")
    return diff


def _write_curve(work: Path, result: SelectionResult, config: PruningConfig) -> None:
    curve = result.curve
    ks = curve.ks.tolist() if curve is not None else []
    mss = curve.mss.tolist() if curve is not None else []
    knees = {str(d): k.k for d, k in sorted(result.knees.items())}
    _write_json(work / "mss_curve.json", {
        "k": ks,
        "mss": mss,
        "polynomial_degree": config.poly_degree,
        "knee": result.k_star,
        "knee_found": result.knee.found if result.knee else None,
        "fixed_heads_to_keep": config.heads_to_keep,
        "knees_by_degree": knees,
        "knees_found_by_degree": {str(d): k.found for d, k in sorted(result.knees.items())},
        "seed": config.seed,
    })
    plot_mss_curve(ks, mss, {d: k.k for d, k in result.knees.items()}, int(result.k_star or 0),
                   work / "mss_curve.png", chosen_degree=None if config.heads_to_keep else config.poly_degree)


def _write_head_map(work: Path, result: SelectionResult) -> None:
    sel = result.selection
    shape = sel.kept_mask.shape
    cluster = (result.clustering.labels.reshape(shape) if result.clustering is not None
               else np.zeros(shape, dtype=np.int64))
    medoids = result.clustering.medoids.tolist() if result.clustering is not None else []
    _write_json(work / "head_map.json", {
        "num_layers": shape[0],
        "num_heads": shape[1],
        "strategy": sel.strategy,
        "k_star": result.k_star,
        "kept": {str(layer): heads for layer, heads in sel.kept.items()},
        "salience": result.salience.tolist(),
        "salience_raw": result.salience_raw.tolist(),
        "cluster": cluster.tolist(),
        "medoids": [[m // shape[1], m % shape[1]] for m in medoids],
        "representatives": [list(h) for h in sel.representatives],
        "layer_safety_added": [list(h) for h in sel.layer_safety_added],
        "graph_space": result.graph_space.points.tolist() if result.graph_space is not None else [],
    })
    plot_head_map(sel.kept_mask, result.salience, cluster, work / "head_map.png",
                  representatives=sel.representatives, layer_safety_added=sel.layer_safety_added)
    plot_layer_retention(sel.kept_mask, work / "layer_retention.png")


def _dataset_record(ref: str, splits: DatasetSplits, options: DatasetOptions, n_train: int,
                    n_eval: int, *, local: bool) -> dict[str, Any]:
    return {
        "ref": ref,
        # The resolved directory or hub id; under another name (a job's URI) it would be a worker path.
        "source": splits.source if local else ref,
        "format": splits.format,
        "splits_found": list(splits.splits_found),
        "train_split": options.train_split,
        "eval_split": splits.eval_split,
        "text_column": options.text_column,
        "text_pair_column": options.text_pair_column,
        "label_column": options.label_column,
        "label_names": list(splits.label_names),
        "train_rows": n_train,
        "eval_rows": n_eval,
    }


def _environment() -> dict[str, Any]:
    versions: dict[str, str | None] = {}
    for name in _VERSIONED:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "versions": versions,
    }


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    path.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n")
