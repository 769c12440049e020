"""The report's last facts, once every model is measured: identity, recipe, quality, and the summary's figures.

:func:`complete_report` adds to a finished :class:`~cahp_engine.run.RunReport` what the model is
(:func:`~cahp_engine.run._identity.identity_of`), how it was made (``recipe``), the quality checks of
the dense, pruned and int8 models (flags first in ``warnings``), the report's ``speed`` taken from the
run's one latency measurement, and the summary's macro-F1, ONNX and int8 figures and speed-up
intervals, so the job's result, the webhook, the cards and the console quote the same numbers.
:func:`complete_failed_report` adds the same records to the report of a run that missed its accuracy
budget, as far as it went.
"""

from __future__ import annotations

import dataclasses

from cahp_engine.config import PruningConfig
from cahp_engine.run._deploy import INT8_PRUNED, ONNX_PRUNED, TORCH_PRUNED, torch_speed
from cahp_engine.run._identity import RunIdentity, identity_of, recipe_of
from cahp_engine.run._quality import AccuracyBudget, assess_quality
from cahp_engine.run._report import FailedRunReport, RunReport
from cahp_engine.run._warning_codes import code_warnings

#: The batch size the summary's speed-ups are quoted at.
SUMMARY_BATCH = 32


def complete_report(report: RunReport, *, identity: RunIdentity | None, model_ref: str, dataset_ref: str) -> RunReport:
    """``report`` with ``identity``, ``recipe``, ``quality`` and the summary's figures filled in."""
    export = report.export
    ident = identity_of(identity, model_ref=model_ref, dataset_ref=dataset_ref,
                        class_names=tuple(report.dataset.label_names))
    int8 = export.onnx_int8
    int8_metrics = int8.accuracy if int8 is not None else None
    quality = assess_quality(dense=report.metrics.dense, pruned=report.metrics.pruned, int8=int8_metrics,
                             label_names=report.dataset.label_names, budget=_budget_of(report.config))
    warnings = quality.messages + tuple(w for w in report.warnings if w not in quality.messages)
    speed = torch_speed(export) if export.speed is not None else report.speed

    def interval(candidate: str) -> tuple[float | None, float | None]:
        found = export.speedup_interval_at(candidate, SUMMARY_BATCH)
        return found if found is not None else (None, None)

    torch_low, torch_high = interval(TORCH_PRUNED)
    onnx_low, onnx_high = interval(ONNX_PRUNED)
    int8_low, int8_high = interval(INT8_PRUNED)
    onnx_metrics = export.onnx.accuracy if export.onnx is not None else None
    summary = dataclasses.replace(
        report.summary,
        speedup=speed.speedup_at(SUMMARY_BATCH), speedup_low=torch_low, speedup_high=torch_high,
        onnx_speedup_low=onnx_low, onnx_speedup_high=onnx_high, int8_speedup_low=int8_low,
        int8_speedup_high=int8_high,
        base_model=ident.base_model, dataset=ident.dataset,
        dense_macro_f1=report.metrics.dense.macro_f1, pruned_macro_f1=report.metrics.pruned.macro_f1,
        onnx_accuracy=onnx_metrics.accuracy if onnx_metrics is not None else None,
        onnx_macro_f1=onnx_metrics.macro_f1 if onnx_metrics is not None else None,
        int8_macro_f1=int8_metrics.macro_f1 if int8_metrics is not None else None,
        int8_max_abs_diff=(int8.deviation.max_abs_diff if int8 is not None and int8.deviation is not None
                           else None),
        warnings=warnings, warning_codes=code_warnings(warnings, quality.flags),
    )
    return dataclasses.replace(report, summary=summary, speed=speed, warnings=warnings, identity=ident,
                               recipe=recipe_of(report), quality=quality)


def complete_failed_report(report: FailedRunReport, *, identity: RunIdentity | None, model_ref: str,
                           dataset_ref: str) -> FailedRunReport:
    """``report`` of a run that missed its accuracy budget with ``identity``, ``recipe`` and ``quality``.

    The same records as :func:`complete_report` adds, from what such a run reached: the recipe has no
    recovery (no candidate was kept), and the quality checks are the dense model's, the one model it
    scored on the evaluation split; their flags open ``warnings``.
    """
    ident = identity_of(identity, model_ref=model_ref, dataset_ref=dataset_ref,
                        class_names=tuple(report.dataset.label_names))
    quality = assess_quality(dense=report.metrics.dense, pruned=None, int8=None,
                             label_names=report.dataset.label_names, budget=_budget_of(report.config))
    warnings = quality.messages + tuple(w for w in report.warnings if w not in quality.messages)
    return dataclasses.replace(report, warnings=warnings, identity=ident, recipe=recipe_of(report), quality=quality)


def _budget_of(config: PruningConfig) -> AccuracyBudget | None:
    """The accuracy budget ``config`` sets for the quality checks, or None."""
    if config.max_accuracy_drop is None:
        return None
    return AccuracyBudget(config.max_accuracy_drop, config.budget_metric)
