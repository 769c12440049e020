"""A whole pruning run: load, (dense fine-tune), select, prune, recover, evaluate, write artifacts.

This is what ``cahp prune`` and the job service's worker call. Everything goes to a temporary
sibling directory that is renamed to ``output_dir`` only when the run succeeded, so an interrupted
or failed run never leaves something that looks like a result. The steps are in
:mod:`cahp_engine.run._steps`, the files in :mod:`cahp_engine.run._artifacts`, the report in
:mod:`cahp_engine.run._report`.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from cahp_engine._output_dir import prepare_output_dir, staged_output
from cahp_engine._torch import resolve_device
from cahp_engine.config import PruningConfig
from cahp_engine.data import DEFAULT_MAX_ROWS, DatasetOptions
from cahp_engine.errors import AccuracyBudgetError
from cahp_engine.models import DEFAULT_MAX_MODEL_PARAMS
from cahp_engine.progress import Monitor, RunProgress, skipped_stages, stage_spans
from cahp_engine.recovery import Reconstruction, TeacherLogits, count_parameters
from cahp_engine.results import BudgetRecord, ClassificationMetrics, TrainingResult
from cahp_engine.run import _steps as steps
from cahp_engine.run._artifacts import (
    write_artifacts,
    write_budget_plot,
    write_curve,
    write_head_map,
    write_json,
)
from cahp_engine.run._budget import budget_warnings
from cahp_engine.run._checkpoints import Checkpointer, CheckpointStore
from cahp_engine.run._completion import complete_failed_report, complete_report
from cahp_engine.run._deploy import (
    INT8_PRUNED,
    ONNX_PRUNED,
    TORCH_PRUNED,
    export_for_deployment,
    latency_seq_len,
    torch_speed,
    write_cards,
)
from cahp_engine.run._executors import CandidateExecutor
from cahp_engine.run._identity import RunIdentity
from cahp_engine.run._live import LOG_INTERVAL_S, LiveLog
from cahp_engine.run._reconstruct import reconstructs
from cahp_engine.run._report import (
    REPORT_FORMAT_VERSION,
    DatasetInfo,
    DenseFinetuneRecord,
    Environment,
    FailedRunMetrics,
    FailedRunReport,
    ModelInfo,
    RunError,
    RunMetrics,
    RunParameters,
    RunReport,
    RunSummary,
    SelectionRecord,
    ValidationRecord,
)
from cahp_engine.selection import SelectionResult

_VERSIONED = ("torch", "transformers", "scikit-learn", "kmedoids", "kneed", "numpy", "safetensors", "cahp")


def run_pruning(
    model_ref: str,
    dataset_ref: str,
    output_dir: Path | str,
    config: PruningConfig,
    *,
    dataset_options: DatasetOptions | None = None,
    max_dataset_rows: int | None = DEFAULT_MAX_ROWS,
    max_model_params: int = DEFAULT_MAX_MODEL_PARAMS,
    revision: str | None = None,
    hub_token: str | None = None,
    cache_dir: str | None = None,
    overwrite: bool = False,
    model_name: str | None = None,
    dataset_name: str | None = None,
    identity: RunIdentity | None = None,
    progress: Callable[[str, float], None] | None = None,
    should_cancel: Callable[[], bool] | None = None,
    log: Callable[[str], None] | None = None,
    checkpoints: CheckpointStore | None = None,
    checkpoint_interval_s: float = 0.0,
    checkpoint_when_stopped: Callable[[], bool] | None = None,
    candidates: CandidateExecutor | None = None,
    log_interval_s: float = LOG_INTERVAL_S,
) -> RunReport:
    """Prune ``model_ref`` on ``dataset_ref`` and write the artifacts to ``output_dir``.

    Parameters
    ----------
    model_ref : str
        A local model directory or a hub id.
    dataset_ref : str
        A local dataset directory or a hub dataset id (see :func:`~cahp_engine.data.load_splits`).
    output_dir : path
        Must not exist or be empty (unless ``overwrite``). Receives ``model/`` and :data:`ARTIFACT_FILES`.
    config : PruningConfig
    dataset_options : DatasetOptions, optional
    max_dataset_rows : int or None
        Most rows a dataset split may have; a larger split is refused before it is read
        (:data:`~cahp_engine.data._splits.DEFAULT_MAX_ROWS`; None for no limit).
    max_model_params : int
        Most parameters the model may declare (a pruned one: before pruning); a larger model, or one whose
        weights do not fit its config, is refused before it is allocated
        (:data:`~cahp_engine.models.DEFAULT_MAX_MODEL_PARAMS`).
    revision, hub_token, cache_dir : optional
        Hub access for model and dataset.
    overwrite : bool
        Replace a non-empty ``output_dir`` (only once the run has succeeded).
    model_name, dataset_name : str, optional
        How the report and the log name the model and the dataset (default: ``model_ref`` and
        ``dataset_ref``). The job service passes the job's URIs, so no worker path reaches a caller.
    identity : RunIdentity, optional
        What the caller knows of the model that the inputs cannot say: its name, the job and its
        labels, the names of uploaded inputs. ``report.identity`` adds what the inputs say (hub ids,
        the checkpoint's ``_name_or_path``), and the cards, the summary and the recipe follow.
    progress : callable(stage, overall_fraction), optional
        ``overall_fraction`` places the stage's own progress in its span
        (:func:`~cahp_engine.progress.stage_spans` of the stages this run has); it never decreases.
    should_cancel : callable() -> bool, optional
        Polled between steps; True raises :class:`~cahp_engine.errors.JobCancelledError`.
    log : callable(str), optional
        Receives human-readable lines about what the run is doing: at least one every
        ``log_interval_s`` seconds of a long stage (a fine-tuning's epoch, loss and pace).
    checkpoints : CheckpointStore, optional
        Where the run saves each finished stage and its fine-tunings' stops, and whence it resumes what
        an earlier run of the same job saved (:mod:`cahp_engine.run._checkpoints`).
    checkpoint_interval_s : float
        A fine-tuning's state is saved at its stops (epoch ends), no more often than this.
    checkpoint_when_stopped : callable() -> bool, optional
        Asked when ``should_cancel`` stops a fine-tuning: True saves its state at the last step taken
        first (the job service: a worker that shuts down hands its job back without losing the epoch).
    candidates : CandidateExecutor, optional
        Runs an accuracy budget's candidates (default: here, one after another; the job service: its
        worker pool). The answer is the same whoever runs them.
    log_interval_s : float

    Returns
    -------
    RunReport
        What ``report.json`` holds (``report.to_dict()``); ``report.summary`` has the headline figures.
    """
    started = time.perf_counter()
    out = Path(output_dir).expanduser().resolve()
    prepare_output_dir(out, overwrite=overwrite)
    say = log or (lambda _line: None)

    placed = RunProgress(progress, stage_spans(skipped_stages(config)))
    live = LiveLog(say, interval_s=log_interval_s)

    def overall(stage: str, fraction: float) -> None:
        placed(stage, fraction)
        live.progress(stage, fraction)

    resumed = Checkpointer(checkpoints, config, say, live=live, interval_s=checkpoint_interval_s,
                           save_when_stopped=checkpoint_when_stopped)
    run = steps.RunContext(config=config, device=resolve_device(config.device),
                           monitor=Monitor(overall, should_cancel), say=say, overall=overall,
                           should_cancel=should_cancel, training=resumed, candidates=candidates)
    with staged_output(out, publish_on=(AccuracyBudgetError,)) as work:
        # A missed accuracy budget is the one documented exception to "a failed run leaves nothing":
        # the candidates' report and plots say why no head count met it (report.json has "status": "failed").
        report = _run(run, resumed, work=work, model_ref=model_ref, dataset_ref=dataset_ref,
                      options=dataset_options or DatasetOptions(), max_rows=max_dataset_rows,
                      max_params=max_model_params, revision=revision,
                      hub_token=hub_token, cache_dir=cache_dir, model_name=model_name or model_ref,
                      dataset_name=dataset_name or dataset_ref, identity=identity)
        report = complete_report(report, identity=identity, model_ref=model_ref, dataset_ref=dataset_ref)
        report = dataclasses.replace(report, wall_time_s=time.perf_counter() - started)
        write_cards(work, report)
        write_json(work / "report.json", report.to_dict())
    overall("artifacts", 1.0)
    say(f"done: artifacts in {out}")
    return report


@dataclasses.dataclass(frozen=True)
class _Recovered:
    """What the plain path or the budget search hands on: the selection it pruned to and the recovered model."""

    result: SelectionResult
    pruned: nn.Module
    before: ClassificationMetrics
    recovery: TrainingResult
    parameters: RunParameters
    budget: BudgetRecord | None = None
    reconstruction: Reconstruction | None = None


def _run(
    run: steps.RunContext,
    resumed: Checkpointer,
    *,
    work: Path,
    model_ref: str,
    dataset_ref: str,
    options: DatasetOptions,
    max_rows: int | None,
    max_params: int,
    revision: str | None,
    hub_token: str | None,
    cache_dir: str | None,
    model_name: str,
    dataset_name: str,
    identity: RunIdentity | None = None,
) -> RunReport:
    """The steps in order; the report without its wall time, which the caller adds (``identity`` goes
    only into the report of a missed accuracy budget: the caller completes a finished one)."""
    config = run.config
    inputs = steps.load(run, model_ref=model_ref, dataset_ref=dataset_ref, options=options, revision=revision,
                        hub_token=hub_token, cache_dir=cache_dir, model_name=model_name, dataset_name=dataset_name,
                        max_rows=max_rows, max_params=max_params)
    loaded, model = inputs.loaded, inputs.loaded.model
    warnings: list[str] = []
    if config.dense_finetune == "never" and not loaded.classifier_trained:
        warnings.append("the model's classifier head is untrained and dense fine-tuning is off; "
                        "selection will profile an untrained classifier")
    dense = resumed.dense_finetune(run, model=model, inputs=inputs, classifier_trained=loaded.classifier_trained)
    dense_metrics = steps.evaluate_dense(run, model=model, evaluation=inputs.evaluation)
    result = resumed.select(run, model=model, train=inputs.rows)
    warnings.extend(result.warnings)
    teacher = steps.teacher(run, model=model, train=inputs.train)
    held = _dense_on_validation(run, inputs, model)
    if config.max_accuracy_drop is None:
        pruned, parameters = steps.prune(run, model=model, selection=result.selection)
        before = resumed.evaluate_pruned(run, model=pruned, evaluation=inputs.evaluation)
        reconstruction = steps.reconstruct_layers(run, dense=model, pruned=pruned, rows=inputs.rows) \
            if reconstructs(config) else None
        validate = None if held is None or inputs.validation is None else steps.validation_scorer(
            run, validation=inputs.validation, dense=held[0].dense)
        with resumed.training("recovery"):
            recovery = steps.recover(run, model=pruned, train=inputs.train, teacher=teacher, validate=validate)
        done = _Recovered(result=result, pruned=pruned, before=before, recovery=recovery, parameters=parameters,
                          reconstruction=reconstruction)
    else:
        assert held is not None  # steps.load carves or finds a validation split whenever a budget is set
        try:
            done = _within_budget(run, inputs=inputs, model=model, result=result, teacher=teacher, held=held)
        except AccuracyBudgetError as exc:
            if exc.budget is not None:
                warnings.extend(budget_warnings(exc.budget))
            _write_failure(work, run, exc, result=result, inputs=inputs, options=options, dense=dense,
                           dense_metrics=dense_metrics, warnings=warnings, model_name=model_name,
                           dataset_name=dataset_name, dataset_ref=dataset_ref, revision=revision,
                           validation=held[0], model_ref=model_ref, identity=identity)
            raise
    result, pruned = done.result, done.pruned
    after = steps.evaluate_recovered(run, pruned=pruned, evaluation=inputs.evaluation)
    warnings.extend(steps.recall_warnings(dense_metrics, after, tuple(inputs.splits.label_names)))
    if done.budget is not None:
        warnings.extend(budget_warnings(done.budget))
    export = export_for_deployment(run, work=work, dense=model, pruned=pruned, tokenizer=loaded.tokenizer,
                                   evaluation=inputs.evaluation, seq_len=latency_seq_len(inputs.evaluation))
    with run.monitor.stage("artifacts"):
        checkpoint = write_artifacts(work, pruned=pruned, tokenizer=loaded.tokenizer, result=result, config=config,
                                     evaluation=inputs.evaluation, device=run.device)
        if done.budget is not None:
            write_budget_plot(work, done.budget, int(result.selection.kept_mask.size))

    sel = result.selection
    return RunReport(
        format_version=REPORT_FORMAT_VERSION,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        summary=RunSummary(
            k_star=result.k_star, heads_total=int(sel.kept_mask.size), heads_kept=sel.num_kept,
            retention=sel.retention, dense_accuracy=dense_metrics.accuracy, pruned_accuracy=after.accuracy,
            speedup=export.speedup_at(TORCH_PRUNED),
            onnx_max_abs_diff=export.onnx.parity.max_abs_diff if export.onnx and export.onnx.parity else None,
            onnx_speedup=export.speedup_at(ONNX_PRUNED),
            int8_accuracy=(export.onnx_int8.accuracy.accuracy
                           if export.onnx_int8 is not None and export.onnx_int8.accuracy is not None else None),
            int8_speedup=export.speedup_at(INT8_PRUNED),
        ),
        **_shared_records(run, inputs, options, dense, result, model_name=model_name, dataset_name=dataset_name,
                          dataset_ref=dataset_ref, revision=revision),
        metrics=RunMetrics(dense=dense_metrics, pruned_before_recovery=done.before, pruned=after),
        parameters=done.parameters,
        speed=torch_speed(export),
        recovery=done.recovery,
        checkpoint=checkpoint,
        export=export,
        timings_s=dict(run.monitor.timings),
        warnings=tuple(warnings),
        wall_time_s=0.0,
        budget=done.budget,
        validation=None if held is None else held[0],
        reconstruction=done.reconstruction,
    )


def _dense_on_validation(run: steps.RunContext, inputs: steps.Inputs,
                         model: nn.Module) -> tuple[ValidationRecord, np.ndarray] | None:
    """The dense model on the validation split recovery judges on (None when it judges on none)."""
    if inputs.validation is None or inputs.held_out is None:
        return None
    metrics, predictions = steps.evaluate_validation(run, model=model, validation=inputs.validation)
    held = inputs.held_out
    record = ValidationRecord(split=held.split, carved=held.carved, rows=len(inputs.validation),
                              metric=run.config.budget_metric, dense=metrics)
    return record, predictions


def _within_budget(run: steps.RunContext, *, inputs: steps.Inputs, model: nn.Module, result: SelectionResult,
                   teacher: TeacherLogits | None, held: tuple[ValidationRecord, np.ndarray]) -> _Recovered:
    """The accuracy budget's search, then the chosen candidate as the run's selection (docs/method.md).

    Raises :class:`AccuracyBudgetError` when no candidate is within the budget.
    """
    outcome = steps.budget_search(run, inputs=inputs, model=model, result=result, teacher=teacher,
                                  dense_validation=held[0].dense, dense_predictions=held[1])
    assert result.analysis is not None
    result = dataclasses.replace(result, selection=outcome.selection, k_star=outcome.k, knee=None,
                                 clustering=result.analysis.partition(outcome.k))
    # Only now is the evaluation split read: the search itself never touched it.
    fresh, _ = steps.prune(run, model=model, selection=outcome.selection)
    before = steps.evaluate_pruned(run, model=fresh, evaluation=inputs.evaluation)
    del fresh
    pruned = outcome.model
    return _Recovered(result=result, pruned=pruned, before=before, recovery=outcome.recovery,
                      parameters=RunParameters(dense=count_parameters(model), pruned=count_parameters(pruned)),
                      budget=outcome.record, reconstruction=outcome.reconstruction)


def _model_info(inputs: steps.Inputs, model_name: str, revision: str | None) -> ModelInfo:
    loaded = inputs.loaded
    return ModelInfo(ref=model_name, revision=revision, family=loaded.family, layers=loaded.num_layers,
                     heads_per_layer=loaded.num_heads, classifier_trained=loaded.classifier_trained)


def _dataset_info(inputs: steps.Inputs, options: DatasetOptions, dataset_name: str, dataset_ref: str) -> DatasetInfo:
    splits = inputs.splits
    return DatasetInfo(
        ref=dataset_name,
        # The resolved directory or hub id; under another name (a job's URI) it would be a worker path.
        source=splits.source if dataset_name == dataset_ref else dataset_name,
        format=splits.format, splits_found=tuple(splits.splits_found), train_split=options.train_split,
        eval_split=splits.eval_split, text_column=options.text_column,
        text_pair_column=options.text_pair_column, label_column=options.label_column, config=options.config,
        label_names=tuple(splits.label_names), train_rows=len(inputs.rows), eval_rows=len(inputs.evaluation),
    )


def _shared_records(
    run: steps.RunContext, inputs: steps.Inputs, options: DatasetOptions, dense: DenseFinetuneRecord,
    result: SelectionResult, *, model_name: str, dataset_name: str, dataset_ref: str, revision: str | None,
) -> dict[str, Any]:
    """The records :class:`RunReport` and :class:`FailedRunReport` share, by field name."""
    config = run.config
    return {
        "model": _model_info(inputs, model_name, revision),
        "dataset": _dataset_info(inputs, options, dataset_name, dataset_ref),
        "config": config,
        "seed": config.seed,
        "device": str(run.device),
        "environment": _environment(),
        "dense_finetune": dense,
        "selection": _selection_record(result, config),
    }


def _write_failure(
    work: Path, run: steps.RunContext, exc: AccuracyBudgetError, *, result: SelectionResult, inputs: steps.Inputs,
    options: DatasetOptions, dense: DenseFinetuneRecord, dense_metrics: ClassificationMetrics, warnings: list[str],
    model_name: str, dataset_name: str, dataset_ref: str, revision: str | None, validation: ValidationRecord,
    model_ref: str, identity: RunIdentity | None,
) -> None:
    """What a run that missed its accuracy budget leaves: the curve, the head map of the knee's
    choice, and a report with ``"status": "failed"``, the error, every candidate tried, and what the
    model would have been (identity, recipe, the dense model's quality checks)."""
    config = run.config
    write_curve(work, result, config)
    write_head_map(work, result)
    budget = exc.budget
    if budget is not None:
        write_budget_plot(work, budget, int(result.selection.kept_mask.size))
    report = FailedRunReport(
        format_version=REPORT_FORMAT_VERSION,
        status="failed",
        error=RunError(code=exc.code, message=str(exc)),
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        **_shared_records(run, inputs, options, dense, result, model_name=model_name, dataset_name=dataset_name,
                          dataset_ref=dataset_ref, revision=revision),
        metrics=FailedRunMetrics(dense=dense_metrics),
        budget=budget,
        timings_s=dict(run.monitor.timings),
        warnings=tuple(warnings),
        validation=validation,
    )
    report = complete_failed_report(report, identity=identity, model_ref=model_ref, dataset_ref=dataset_ref)
    write_json(work / "report.json", report.to_dict())


def _selection_record(result: SelectionResult, config: PruningConfig) -> SelectionRecord:
    sel = result.selection
    return SelectionRecord(
        strategy=sel.strategy,
        k_star=result.k_star,
        poly_degree=config.poly_degree,
        knee_found=result.knee.found if result.knee else None,
        knees_by_degree={d: k.k for d, k in sorted(result.knees.items())},
        heads_total=int(sel.kept_mask.size),
        heads_kept=sel.num_kept,
        retention=sel.retention,
        kept={layer: tuple(heads) for layer, heads in sel.kept.items()},
        layer_safety_added=tuple(sel.layer_safety_added),
        resolution=result.resolution,
        signature_samples=result.signature_samples,
        calibration_samples=result.calibration_samples,
        perplexity=result.perplexity,
        signature_sampling=result.signature_sampling,
        calibration_sampling=result.calibration_sampling,
        stability=result.stability,
        consensus=result.consensus,
    )


def _environment() -> Environment:
    versions: dict[str, str | None] = {}
    for name in _VERSIONED:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return Environment(
        python=sys.version.split()[0],
        platform=platform.platform(),
        cpu_count=os.cpu_count(),
        torch_threads=torch.get_num_threads(),
        cuda=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        versions=versions,
    )
