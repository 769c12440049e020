"""The report's records, made from what a run read and did, and what a run that missed its budget leaves.

:func:`~cahp_engine.run.run_pruning` (``_run``) runs the stages; this module turns their results
into the records :class:`~cahp_engine.run.RunReport` and :class:`~cahp_engine.run.FailedRunReport`
share (the model, the dataset, the environment, the selection) and writes the report of a run whose
accuracy budget no candidate met (:func:`write_failure`).
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from cahp_engine.config import PruningConfig
from cahp_engine.errors import AccuracyBudgetError
from cahp_engine.recovery import ClassificationMetrics
from cahp_engine.run import _steps as steps
from cahp_engine.run._artifacts import write_budget_plot, write_curve, write_head_map, write_json
from cahp_engine.run._completion import complete_failed_report
from cahp_engine.run._report import (
    REPORT_FORMAT_VERSION,
    DatasetInfo,
    DenseFinetuneRecord,
    Environment,
    FailedRunMetrics,
    FailedRunReport,
    ModelInfo,
    RunError,
    SelectionRecord,
    ValidationRecord,
)
from cahp_engine.run._request import RunRequest
from cahp_engine.selection import SelectionResult

_VERSIONED = ("torch", "transformers", "scikit-learn", "kmedoids", "kneed", "numpy", "safetensors", "cahp")


@dataclass(frozen=True)
class Selected:
    """What a run has once it has selected: every report's shared part comes from here.

    ``result`` is the selection the report names (an accuracy budget's choice replaces the knee's);
    ``warnings`` and ``validation`` (the dense model on the validation split recovery judged on) are
    what a missed budget's report adds.
    """

    inputs: steps.Inputs
    dense: DenseFinetuneRecord
    dense_metrics: ClassificationMetrics
    result: SelectionResult
    warnings: tuple[str, ...] = ()
    validation: ValidationRecord | None = None


def created_at() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def shared_records(run: steps.RunContext, request: RunRequest, selected: Selected) -> dict[str, Any]:
    """The records :class:`RunReport` and :class:`FailedRunReport` share, by field name."""
    config = run.config
    return {
        "model": _model_info(selected.inputs, request),
        "dataset": _dataset_info(selected.inputs, request),
        "config": config,
        "seed": config.seed,
        "device": str(run.device),
        "environment": _environment(),
        "dense_finetune": selected.dense,
        "selection": _selection_record(selected.result, config),
    }


def write_failure(work: Path, run: steps.RunContext, request: RunRequest, selected: Selected,
                  exc: AccuracyBudgetError) -> None:
    """What a run that missed its accuracy budget leaves: the curve, the head map of the knee's
    choice, and a report with ``"status": "failed"``, the error, every candidate tried, and what the
    model would have been (identity, recipe, the dense model's quality checks)."""
    result = selected.result
    write_curve(work, result, run.config)
    write_head_map(work, result)
    budget = exc.budget
    if budget is not None and budget.candidates:  # a search that judged nothing has nothing to draw
        write_budget_plot(work, budget, int(result.selection.kept_mask.size))
    assert selected.validation is not None  # a budget always judges on a validation split
    report = FailedRunReport(
        format_version=REPORT_FORMAT_VERSION,
        status="failed",
        error=RunError(code=exc.code, message=str(exc)),
        created_at=created_at(),
        **shared_records(run, request, selected),
        metrics=FailedRunMetrics(dense=selected.dense_metrics),
        budget=budget,
        timings_s=dict(run.monitor.timings),
        warnings=selected.warnings,
        validation=selected.validation,
    )
    report = complete_failed_report(report, identity=request.identity, model_ref=request.model_ref,
                                    dataset_ref=request.dataset_ref)
    write_json(work / "report.json", report.to_dict())


def _model_info(inputs: steps.Inputs, request: RunRequest) -> ModelInfo:
    loaded = inputs.loaded
    return ModelInfo(ref=request.model_shown, revision=request.revision, family=loaded.family,
                     layers=loaded.num_layers, heads_per_layer=loaded.num_heads,
                     classifier_trained=loaded.classifier_trained)


def _dataset_info(inputs: steps.Inputs, request: RunRequest) -> DatasetInfo:
    splits, options, shown = inputs.splits, request.dataset_options, request.dataset_shown
    return DatasetInfo(
        ref=shown,
        # The resolved directory or hub id; under another name (a job's URI) it would be a worker path.
        source=splits.source if shown == request.dataset_ref else shown,
        format=splits.format, splits_found=tuple(splits.splits_found), train_split=options.train_split,
        eval_split=splits.eval_split, text_column=options.text_column,
        text_pair_column=options.text_pair_column, label_column=options.label_column, config=options.config,
        label_names=tuple(splits.label_names), train_rows=len(inputs.rows), eval_rows=len(inputs.evaluation),
    )


def _selection_record(result: SelectionResult, config: PruningConfig) -> SelectionRecord:
    sel, analysis = result.selection, result.analysis
    return SelectionRecord(
        strategy=sel.strategy,
        k_star=result.k_star,
        poly_degree=config.poly_degree,
        knee_found=result.knee.found if result.knee else None,
        knees_by_degree={d: k.k for d, k in sorted(analysis.knees.items())},
        heads_total=int(sel.kept_mask.size),
        heads_kept=sel.num_kept,
        retention=sel.retention,
        kept={layer: tuple(heads) for layer, heads in sel.kept.items()},
        layer_safety_added=tuple(sel.layer_safety_added),
        resolution=analysis.resolution,
        signature_samples=analysis.signature_samples,
        calibration_samples=analysis.calibration_samples,
        perplexity=analysis.graph_space.perplexity,
        signature_sampling=analysis.signature_sampling,
        calibration_sampling=analysis.calibration_sampling,
        stability=result.stability,
        consensus=sel.consensus,
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
