"""A whole pruning run: load, (dense fine-tune), select, prune, recover, evaluate, write artifacts.

This is what ``cahp prune`` and the job service's worker call, with one :class:`RunRequest` (what to
run) and its :class:`RunHooks` (what to hear back). Everything goes to a temporary sibling directory
that is renamed to ``output_dir`` only when the run succeeded, so an interrupted or failed run never
leaves something that looks like a result. :func:`_run` holds the stages in order; the steps are in
:mod:`cahp_engine.run._steps`, the files in :mod:`cahp_engine.run._artifacts`, the report's records
in :mod:`cahp_engine.run._records` and :mod:`cahp_engine.run._report`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from torch import nn

from cahp_engine._output_dir import prepare_output_dir, staged_output
from cahp_engine._torch import resolve_device
from cahp_engine.errors import AccuracyBudgetError
from cahp_engine.progress import Monitor, RowCounts, RunProgress, stage_plan
from cahp_engine.recovery import ClassificationMetrics, Reconstruction, TrainingResult, count_parameters
from cahp_engine.results import BudgetRecord
from cahp_engine.run import _steps as steps
from cahp_engine.run._artifacts import write_artifacts, write_budget_plot, write_json
from cahp_engine.run._budget import budget_warnings
from cahp_engine.run._candidates import SearchInputs
from cahp_engine.run._completion import complete_report
from cahp_engine.run._deploy import (
    INT8_PRUNED,
    ONNX_PRUNED,
    TORCH_PRUNED,
    export_for_deployment,
    torch_speed,
    write_cards,
)
from cahp_engine.run._fastest import FastestOutcome, FastestScope, fastest_search, with_recovery
from cahp_engine.run._holdout import seen_in_training
from cahp_engine.run._hooks import RunHooks
from cahp_engine.run._live import LiveLog
from cahp_engine.run._reconstruct import reconstructs
from cahp_engine.run._records import Selected, created_at, shared_records, write_failure
from cahp_engine.run._report import (
    REPORT_FORMAT_VERSION,
    RunMetrics,
    RunParameters,
    RunReport,
    RunSummary,
    TargetRecord,
    ValidationRecord,
)
from cahp_engine.run._request import RunRequest
from cahp_engine.run._resume import Resumer, SavePolicy
from cahp_engine.run._target_check import has_target
from cahp_engine.run._target_stage import prune_for_run
from cahp_engine.selection import SelectionResult


def run_pruning(request: RunRequest, hooks: RunHooks | None = None) -> RunReport:
    """Prune ``request.model_ref`` on ``request.dataset_ref`` and write the artifacts to ``request.output_dir``.

    Parameters
    ----------
    request : RunRequest
        The inputs, the :class:`~cahp_engine.config.PruningConfig`, the limits, the output directory and
        what the caller knows of the model (:class:`~cahp_engine.run.RunIdentity`).
    hooks : RunHooks, optional
        Progress, log, cancellation, the resume store and who runs an accuracy budget's candidates; none of
        them changes the result.

    Returns
    -------
    RunReport
        What ``report.json`` holds (``report.to_dict()``); ``report.summary`` has the headline figures.

    Examples
    --------
    >>> report = run_pruning(RunRequest(model_ref="path/to/model", dataset_ref="path/to/data",
    ...                                 output_dir="out", config=PruningConfig()))  # doctest: +SKIP
    """
    started = time.perf_counter()
    hooks = hooks or RunHooks()
    config = request.config
    out = Path(request.output_dir).expanduser().resolve()
    prepare_output_dir(out, overwrite=request.overwrite)
    say = hooks.say

    placed = RunProgress(hooks.progress, stage_plan(config).spans)
    live = LiveLog(say, interval_s=hooks.log_interval_s)

    def overall(stage: str, fraction: float) -> None:
        placed(stage, fraction)
        live.progress(stage, fraction)

    resumed = Resumer(hooks.resume_store, config, say, live=live,
                      saving=SavePolicy(interval_s=hooks.save_interval_s, when_stopped=hooks.save_when_stopped))
    run = steps.RunContext(config=config, device=resolve_device(config.device),
                           monitor=Monitor(overall, hooks.should_cancel), say=say, overall=overall,
                           should_cancel=hooks.should_cancel, training=resumed, candidates=hooks.candidates)

    def rows_known(rows: RowCounts) -> None:
        # Once loaded, the run's stages take the shares they take on its rows (cahp_engine.progress.stage_plan).
        plan = stage_plan(config, rows)
        placed.replan(plan.spans)
        if hooks.plan is not None:
            hooks.plan(plan)

    with staged_output(out, publish_on=(AccuracyBudgetError,)) as work:
        # A missed accuracy budget is the one documented exception to "a failed run leaves nothing":
        # the candidates' report and plots say why no head count met it (report.json has "status": "failed").
        report = _run(run, resumed, request, work, _Listeners(rows_known, hooks.target_decided or (lambda _: None)))
        report = complete_report(report, identity=request.identity, model_ref=request.model_ref,
                                 dataset_ref=request.dataset_ref)
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
    target: TargetRecord | None = None


@dataclasses.dataclass(frozen=True)
class _Listeners:
    """Who hears of a run's facts as they are settled: ``rows_known`` the rows the fine-tunings and
    evaluations will go through once they are loaded; ``target_decided`` a target's record once the model
    is pruned to it, before reconstruction and recovery."""

    rows_known: Callable[[RowCounts], None]
    target_decided: Callable[[TargetRecord], None]


def _run(run: steps.RunContext, resumed: Resumer, request: RunRequest, work: Path, listeners: _Listeners) -> RunReport:
    """The stages in order; the report without its wall time, identity and recipe, which the caller
    adds (a missed accuracy budget's report is completed and written here, then the error raised)."""
    config = run.config
    rows_known, target_decided = listeners.rows_known, listeners.target_decided
    inputs = steps.load(run, request)
    rows_known(RowCounts(train=len(inputs.rows), evaluation=len(inputs.evaluation)))
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
    if held is not None and held[0].carved and not dense.ran:
        seen = seen_in_training(held[0].dense, dense_metrics, config.budget_metric)
        if seen is not None:
            warnings.append(seen)
            run.say(f"warning: {seen}")
    fastest = config.max_accuracy_drop is not None and config.budget_objective == "speed"
    # What every candidate of an accuracy budget's search shares; steps.load carves or finds a validation split
    # whenever a budget is set.
    shared = None if config.max_accuracy_drop is None or held is None else steps.search_inputs(
        run, inputs=inputs, teacher=teacher, dense_validation=held[0].dense, dense_predictions=held[1])
    if config.max_accuracy_drop is None or fastest:
        target: TargetRecord | None = None
        budget: BudgetRecord | None = None
        if fastest:
            assert held is not None and shared is not None
            try:
                found = _fastest_within_budget(run, inputs=inputs, result=result, shared=shared,
                                               cache_dir=request.latency_cache_dir)
            except AccuracyBudgetError as exc:
                write_failure(work, run, request, Selected(inputs=inputs, dense=dense, dense_metrics=dense_metrics,
                                                           result=result, warnings=tuple(warnings),
                                                           validation=held[0]), exc)
                raise
            pruned, parameters, result, target, budget = (found.model, found.parameters, found.result, found.target,
                                                          found.record)
        elif has_target(config):
            pruned, parameters, result, target = prune_for_run(run, model=model, result=result, rows=inputs.rows,
                                                           cache_dir=request.latency_cache_dir)
        else:
            pruned, parameters = steps.prune(run, model=model, selection=result.selection)
        if target is not None:
            target_decided(target)
            missed = None if fastest else target.shortfall()  # the fastest search's ladder is not the user's ask
            if missed is not None:
                warnings.append(missed)
                run.say(f"warning: {missed}")
        before = (steps.evaluate_pruned if fastest else resumed.evaluate_pruned)(
            run, model=pruned, evaluation=inputs.evaluation)
        reconstruction = steps.reconstruct_layers(run, dense=model, pruned=pruned, rows=inputs.rows) \
            if reconstructs(config) else None
        validate = None if held is None or inputs.validation is None else steps.validation_scorer(
            run, validation=inputs.validation, dense=held[0].dense)
        with resumed.training("recovery"):
            recovery = steps.recover(run, model=pruned, train=inputs.train, teacher=teacher, validate=validate)
        done = _Recovered(result=result, pruned=pruned, before=before, recovery=recovery, parameters=parameters,
                          reconstruction=reconstruction, target=target,
                          budget=None if budget is None else with_recovery(budget, recovery))
    else:
        assert held is not None and shared is not None
        try:
            done = _within_budget(run, inputs=inputs, result=result, shared=shared, book=resumed)
        except AccuracyBudgetError as exc:
            if exc.budget is not None:
                warnings.extend(budget_warnings(exc.budget))
            write_failure(work, run, request, Selected(inputs=inputs, dense=dense, dense_metrics=dense_metrics,
                                                       result=result, warnings=tuple(warnings),
                                                       validation=held[0]), exc)
            raise
    result, pruned = done.result, done.pruned
    after = steps.evaluate_recovered(run, pruned=pruned, evaluation=inputs.evaluation)
    warnings.extend(steps.recall_warnings(dense_metrics, after, tuple(inputs.splits.label_names)))
    if done.budget is not None:
        warnings.extend(budget_warnings(done.budget))
    export = export_for_deployment(run, work=work, dense=model, pruned=pruned, inputs=inputs)
    with run.monitor.stage("artifacts"):
        checkpoint = write_artifacts(run, work=work, pruned=pruned, inputs=inputs, result=result)
        if done.budget is not None:
            write_budget_plot(work, done.budget, int(result.selection.kept_mask.size))

    sel = result.selection
    return RunReport(
        format_version=REPORT_FORMAT_VERSION,
        created_at=created_at(),
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
        **shared_records(run, request, Selected(inputs=inputs, dense=dense, dense_metrics=dense_metrics,
                                                result=result)),
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
        reconstruction=done.reconstruction, target=done.target,
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


def _fastest_within_budget(run: steps.RunContext, *, inputs: steps.Inputs, result: SelectionResult,
                           shared: SearchInputs, cache_dir: str | Path | None) -> FastestOutcome:
    """The fastest speed target within the accuracy budget (:mod:`cahp_engine.run._fastest`): its cut, not yet
    reconstructed (the run's reconstruction stage refits it as the search did).

    Raises :class:`AccuracyBudgetError` when no target is within the budget.
    """
    assert inputs.held_out is not None
    scope = FastestScope(result=result, rows=inputs.rows, validation=inputs.held_out, cache_dir=cache_dir)
    with run.monitor.stage("budget"):
        return fastest_search(shared, scope, say=run.say, progress=lambda share: run.overall("budget", share))


def _within_budget(run: steps.RunContext, *, inputs: steps.Inputs, result: SelectionResult, shared: SearchInputs,
                   book: Resumer | None = None) -> _Recovered:
    """The accuracy budget's search over the dense model, then the chosen candidate as the run's selection
    (docs/method.md).

    Raises :class:`AccuracyBudgetError` when no candidate is within the budget.
    """
    model = inputs.loaded.model
    outcome = steps.budget_search(run, inputs=inputs, result=result, shared=shared, book=book)
    # The report's consensus record stays the one of the configured strategy's choice.
    chosen = dataclasses.replace(outcome.selection, consensus=result.selection.consensus)
    result = dataclasses.replace(result, selection=chosen, k_star=outcome.k, knee=None)
    # Only now is the evaluation split read: the search itself never touched it.
    fresh, _ = steps.prune(run, model=model, selection=outcome.selection)
    before = steps.evaluate_pruned(run, model=fresh, evaluation=inputs.evaluation)
    del fresh
    pruned = outcome.model
    return _Recovered(result=result, pruned=pruned, before=before, recovery=outcome.recovery,
                      parameters=RunParameters(dense=count_parameters(model), pruned=count_parameters(pruned)),
                      budget=outcome.record, reconstruction=outcome.reconstruction)
