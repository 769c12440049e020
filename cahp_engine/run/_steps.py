"""The steps of a pruning run, in order: load, dense fine-tune, select, prune, recover, evaluate.

Each step takes the run's shared :class:`RunContext` and keyword arguments, runs inside its stage of
the run's :class:`~cahp_engine.progress.Monitor` and returns a small typed result; writing the
artifacts is :mod:`cahp_engine.run._artifacts`, and :func:`cahp_engine.run.run_pruning` chains them.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import torch
from torch import nn

from cahp_engine.config import PruningConfig
from cahp_engine.data import (
    DatasetSplits,
    EncodedDataset,
    LazyEncodedDataset,
    TrainRows,
    encode,
    load_splits,
)
from cahp_engine.errors import UntrainedModelError
from cahp_engine.models import LoadedClassifier, load_classifier, prune_heads
from cahp_engine.progress import CancelFn, Monitor
from cahp_engine.recovery import (
    ClassificationMetrics,
    FineTuningHooks,
    Reconstruction,
    TeacherLogits,
    TrainingResult,
    Validator,
    balanced_class_weights,
    count_parameters,
    evaluate,
    finetune,
    reconstruct,
    teacher_logits,
)
from cahp_engine.run._budget import BudgetOutcome, ladder, search
from cahp_engine.run._candidates import SearchInputs
from cahp_engine.run._dense_probe import untrained_in_effect
from cahp_engine.run._executors import CandidateExecutor
from cahp_engine.run._holdout import ValidationData, ValidationScorer, score_of, validation_data
from cahp_engine.run._judged import judged_search
from cahp_engine.run._live import TrainingHooks
from cahp_engine.run._reconstruct import (
    calibration_batches,
    check_reconstruction,
    finetunes,
    judges_budget,
    reconstruction_options,
)
from cahp_engine.run._report import DenseFinetuneRecord, RunParameters
from cahp_engine.run._request import RunRequest
from cahp_engine.run._scoring import LazyScores, ScoreBook, ScoreKeeping
from cahp_engine.run._stage_training import StageTraining, validation_watch
from cahp_engine.run._target_check import check_target_reachable
from cahp_engine.selection import Selection, SelectionResult, select_heads, validate_inputs


@dataclass(frozen=True)
class RunContext:
    """What every step of one run shares.

    Attributes
    ----------
    config : PruningConfig
    device : torch.device
        Where the run computes (``config.device`` resolved).
    monitor : Monitor
        Stage timings, progress within a stage, cancellation.
    say : callable(str)
        Receives human-readable lines about what the run is doing.
    overall : callable(stage, fraction)
        Progress of a stage that reports it in steps (fine-tuning), mapped to the whole run.
    should_cancel : callable() -> bool, optional
    training : TrainingHooks, optional
        Given to every fine-tuning: a saved state to go on from, and a call at each stop (the resume state,
        the live log; :mod:`cahp_engine.run._resume`).
    candidates : CandidateExecutor, optional
        Runs an accuracy budget's candidates (None: here, one after another).
    """

    config: PruningConfig
    device: torch.device
    monitor: Monitor
    say: Callable[[str], None]
    overall: Callable[[str, float], None]
    should_cancel: CancelFn | None = None
    training: TrainingHooks | None = None
    candidates: CandidateExecutor | None = None


@dataclass(frozen=True)
class Inputs:
    """The loaded model and the splits.

    ``rows`` is the training split tokenised on demand: selection reads only the rows it samples.
    ``train`` tokenises every row the first time a step asks for it (fine-tuning). When recovery
    watches a validation split (early stopping, an accuracy budget), ``validation`` is that split and
    ``held_out`` says where it came from; rows carved from the training split are then not in ``rows``.
    """

    loaded: LoadedClassifier
    splits: DatasetSplits
    rows: LazyEncodedDataset
    evaluation: EncodedDataset
    validation: EncodedDataset | None = None
    held_out: ValidationData | None = None

    @cached_property
    def train(self) -> EncodedDataset:
        return self.rows.encoded


def load(run: RunContext, request: RunRequest) -> Inputs:
    """Read the splits, load the classifier onto the run's device, tokenise, check the inputs.

    ``request.max_model_params`` is the most parameters the model may declare; it is checked before the
    model is allocated (see :mod:`cahp_engine.models._preflight`).
    """
    model_ref, dataset_ref, options = request.model_ref, request.dataset_ref, request.dataset_options
    revision, hub_token, cache_dir = request.revision, request.hub_token, request.cache_dir
    max_rows = request.max_dataset_rows
    config, device = run.config, run.device
    with run.monitor.stage("load"):
        run.say(f"reading dataset {request.dataset_shown}")
        splits = load_splits(dataset_ref, options, revision=None, cache_dir=cache_dir, token=hub_token,
                             max_rows=max_rows)
        run.say(f"loading model {request.model_shown}" + (f" at revision {revision}" if revision else ""))
        loaded = load_classifier(model_ref, revision=revision, num_labels=len(splits.label_names),
                                 cache_dir=cache_dir, token=hub_token, device=device, seed=config.seed,
                                 max_params=request.max_model_params)
        loaded.model.to(device).eval()
        if not loaded.classifier_trained or _generic_names(loaded.model):
            # A head cahp creates (or one saved with transformers' placeholder names) classifies the
            # dataset's classes: name them as the dataset does, so config.json (and every export) says
            # `very negative`, not `LABEL_0`, as the model cards do.
            name_classes(loaded.model, splits.label_names)
        held_out = validation = None
        train = splits.train
        if watches_validation(config):
            held_out = validation_data(splits, request, seed=config.seed)
            train = held_out.train
            validation = encode(loaded.tokenizer, held_out.validation, max_length=config.max_length)
            why = "accuracy budget" if config.max_accuracy_drop is not None else "early stopping"
            run.say(f"{why}: validating on {len(validation)} rows "
                    + (f"carved from split {held_out.split!r} (left out of selection and training)"
                       if held_out.carved else f"of split {held_out.split!r}"))
        rows = LazyEncodedDataset(loaded.tokenizer, train, max_length=config.max_length)
        evaluation = encode(loaded.tokenizer, splits.eval, max_length=config.max_length)
        validate_inputs(loaded.model, rows, config)
        check_reconstruction(loaded.model, config, rows)
        check_target_reachable(loaded.model, config)
        run.say(f"{len(rows)} training and {len(evaluation)} evaluation samples, {rows.num_classes} classes; "
                f"{loaded.family} model with {loaded.num_layers}x{loaded.num_heads} heads on {device}")
    return Inputs(loaded=loaded, splits=splits, rows=rows, evaluation=evaluation, validation=validation,
                  held_out=held_out)


def _generic_names(model: nn.Module) -> bool:
    """Whether the model's classes have only transformers' placeholder names (``LABEL_0``, ``LABEL_1``...)."""
    names = dict(getattr(model.config, "id2label", None) or {})
    return bool(names) and all(str(name) == f"LABEL_{int(i)}" for i, name in names.items())


def name_classes(model: nn.Module, label_names: Sequence[str]) -> None:
    """Set the config's ``id2label`` and ``label2id`` from the dataset's class names (index i is class i)."""
    config: Any = model.config
    config.id2label = {i: str(name) for i, name in enumerate(label_names)}
    config.label2id = {str(name): i for i, name in enumerate(label_names)}


def watches_validation(config: PruningConfig) -> bool:
    """Whether the run's recovery judges on a validation split (early stopping or an accuracy budget)."""
    return config.max_accuracy_drop is not None or config.early_stopping_patience > 0


def dense_finetune(
    run: RunContext, *, model: nn.Module, inputs: Inputs, classifier_trained: bool
) -> DenseFinetuneRecord:
    """Fine-tune the dense model in place first, when ``config.dense_finetune`` asks for it.

    Only a run that fine-tunes tokenises the whole training split here; otherwise selection, which
    comes next, reads just the rows it samples.
    """
    config = run.config
    ran, reason = _dense_decision(config.dense_finetune, classifier_trained)
    if config.dense_finetune == "auto" and classifier_trained:
        # A head in the checkpoint may still be random (saved by from_pretrained(num_labels=...)).
        with run.monitor.stage("dense_evaluation"):
            before = evaluate(model, inputs.evaluation, batch_size=config.batch_size, device=run.device)
        untrained = untrained_in_effect(before)
        run.say(f"dense model as loaded: accuracy {before.accuracy:.4f}, macro-F1 {before.macro_f1:.4f}"
                + (f"; {untrained}" if untrained else ""))
        if untrained is not None:
            ran, reason = True, untrained
    training = None
    if ran:
        with run.monitor.stage("dense_finetune"):
            run.say(f"dense fine-tuning ({reason}): {config.dense_epochs} epochs at lr {config.dense_lr}")
            training = train_model(run, model=model, train=inputs.train,
                                   plan=StageTraining("dense_finetune", config.dense_epochs, config.dense_lr))
    return DenseFinetuneRecord(mode=config.dense_finetune, ran=ran, reason=reason, training=training)


def evaluate_dense(run: RunContext, *, model: nn.Module, evaluation: EncodedDataset) -> ClassificationMetrics:
    """Score the dense model on the evaluation split."""
    with run.monitor.stage("dense_evaluation"):
        metrics = evaluate(model, evaluation, batch_size=run.config.batch_size, device=run.device)
        run.say(f"dense accuracy {metrics.accuracy:.4f}, macro-F1 {metrics.macro_f1:.4f}")
    untrained = untrained_in_effect(metrics) if run.config.dense_finetune == "never" else None
    if untrained is not None:
        if run.config.untrained_dense == "fail":
            # Pruning a model that does not read the text yields a model that does not either: stop before
            # the selection's hours, and say what to set.
            raise UntrainedModelError(
                f"the dense model {untrained.removeprefix('its ')}, and dense fine-tuning is off "
                "(`dense_finetune=never`): set `dense_finetune=always` to fine-tune it on the training split "
                "first (`auto` does so when it finds this), or `untrained_dense=warn` to prune it anyway")
        run.say(f"the dense model {untrained.removeprefix('its ')}; pruning it anyway (`untrained_dense=warn`)")
    return metrics


def select(run: RunContext, *, model: nn.Module, train: TrainRows) -> SelectionResult:
    """Head selection (:func:`~cahp_engine.selection.select_heads`); its stage timings join the run's."""
    run.say("selecting heads")
    result = select_heads(model, train, run.config, progress=run.monitor.report, should_cancel=run.should_cancel)
    run.monitor.timings.update(result.timings)
    sel = result.selection
    run.say(f"k* = {result.k_star}; keeping {sel.num_kept} of {sel.kept_mask.size} heads ({sel.retention:.1%})")
    for what, record in (("signature", result.analysis.signature_sampling),
                         ("calibration", result.analysis.calibration_sampling)):
        if record is not None:
            run.say(f"{what} samples: {record.samples} of {record.available} ({record.reason})")
    if result.stability is not None:
        run.say(f"stability: mean Jaccard {result.stability.mean_jaccard:.2f} over {result.stability.shards} "
                "leave-one-shard-out selections")
    return result


def prune(run: RunContext, *, model: nn.Module, selection: Selection) -> tuple[nn.Module, RunParameters]:
    """A pruned copy of ``model`` keeping ``selection``, and the parameter counts of both."""
    with run.monitor.stage("surgery"):
        dense_params = count_parameters(model)
        pruned = copy.deepcopy(model)
        prune_heads(pruned, selection.kept)
        pruned.eval()
        pruned_params = count_parameters(pruned)
    return pruned, RunParameters(dense=dense_params, pruned=pruned_params)


def evaluate_pruned(run: RunContext, *, model: nn.Module, evaluation: EncodedDataset) -> ClassificationMetrics:
    """Score the pruned model before recovery."""
    with run.monitor.stage("pruned_evaluation"):
        metrics = evaluate(model, evaluation, batch_size=run.config.batch_size, device=run.device)
    run.say(f"pruned accuracy before recovery {metrics.accuracy:.4f}")
    return metrics


def reconstruct_layers(run: RunContext, *, dense: nn.Module, pruned: nn.Module, rows: TrainRows) -> Reconstruction:
    """Layer-wise reconstruction of ``pruned`` against ``dense`` (in place), in its own stage."""
    with run.monitor.stage("reconstruction"):
        batches = calibration_batches(rows, run.config, run.device)
        result = reconstruct(dense, pruned, batches, reconstruction_options(pruned, run.config),
                             seed=run.config.seed,
                             progress=lambda done, total: run.overall("reconstruction", done / total),
                             should_cancel=run.should_cancel)
    run.say(result.describe())
    for note in result.notes:
        run.say(note)
    return result


def teacher(run: RunContext, *, model: nn.Module, train: EncodedDataset) -> TeacherLogits | None:
    """The dense model's logits over the training split, once, when recovery fine-tunes and distils (else None)."""
    if run.config.recovery_loss != "distill" or not finetunes(run.config):
        return None
    with run.monitor.stage("teacher"):
        logits = teacher_logits(model, train, batch_size=run.config.batch_size, device=run.device)
    run.say(f"teacher logits over {len(train)} training rows in {logits.record.seconds:.1f} s")
    return logits


def recover(run: RunContext, *, model: nn.Module, train: EncodedDataset, teacher: TeacherLogits | None = None,
            validate: Validator | None = None) -> TrainingResult:
    """Recovery fine-tuning of the pruned model, in place, for ``config.epochs`` (none under ``recovery`` reconstruct).

    With ``teacher`` the loss is the distillation loss (``distill_alpha``, ``distill_temperature``);
    with ``class_weight`` balanced each class weighs ``n / (C n_c)``. With ``validate`` (a scorer of
    the validation split) it evaluates before training and at every evaluation step, keeps the best
    weights, stops after ``early_stopping_patience`` evaluations without gain and ends with the best.
    """
    config, stage = run.config, "recovery"
    with run.monitor.stage(stage):
        how = (f"distillation (alpha {config.distill_alpha:g}, T {config.distill_temperature:g})"
               if teacher is not None else "cross-entropy")
        if config.class_weight == "balanced":
            how += ", class-balanced"
        watch = "" if validate is None else (
            f"; keeping the best validation {config.budget_metric}, patience {config.early_stopping_patience}")
        epochs = config.epochs if finetunes(config) else 0.0
        run.say(f"recovery fine-tuning: {config.epochs:g} epochs at lr {config.lr}, {how}{watch}" if epochs else
                "recovery fine-tuning: none (recovery reconstruct: the reconstructed weights are the result)")
        training = train_model(run, model=model, train=train, plan=StageTraining(
            stage, epochs, config.lr, teacher=teacher, class_weights=class_weights(config, train), validate=validate))
    best = next((p for p in training.validation if p.step == training.best_step), None)
    if best is not None:
        run.say(f"recovery kept the weights after {best.epoch:g} epoch(s): validation {config.budget_metric} "
                f"{best.score:.4f} (before recovery {training.validation[0].score:.4f})"
                + (f"; stopped early after {training.epochs:g} epoch(s)" if training.stopped_early else ""))
    return training


def class_weights(config: PruningConfig, train: EncodedDataset) -> np.ndarray | None:
    """Class-balanced recovery's weights of ``train``'s classes, or None."""
    return balanced_class_weights(train.labels, train.num_classes) if config.class_weight == "balanced" else None


def validation_scorer(run: RunContext, *, validation: EncodedDataset,
                      dense: ClassificationMetrics | None) -> ValidationScorer:
    """Scores a model on the validation split in the run's metric, marking classes lost against ``dense``."""
    return ValidationScorer(validation, run.config.budget_metric, dense, run.config.batch_size, run.device)


def evaluate_recovered(run: RunContext, *, pruned: nn.Module, evaluation: EncodedDataset) -> ClassificationMetrics:
    """Score the recovered model (its speed is measured once, with the exports: ``run._deploy``)."""
    with run.monitor.stage("evaluation"):
        metrics = evaluate(pruned, evaluation, batch_size=run.config.batch_size, device=run.device)
        run.say(f"pruned accuracy after recovery {metrics.accuracy:.4f}, macro-F1 {metrics.macro_f1:.4f}")
    return metrics


def train_model(run: RunContext, *, model: nn.Module, train: EncodedDataset, plan: StageTraining) -> TrainingResult:
    """The shared recipe (batch, warm-up, decay, clipping, seed) with a stage's epochs, rate, loss and watch."""
    stage, resumer = plan.stage, run.training
    hooks = FineTuningHooks(progress=lambda step, total: run.overall(stage, step / max(total, 1)),
                            should_cancel=run.should_cancel,
                            resume=resumer.resume(stage) if resumer is not None else None,
                            on_stop=resumer.on_stop(stage) if resumer is not None else None)
    return finetune(model, train, plan.recipe(run.config, run.device),
                    watch=validation_watch(run.config, plan.validate), hooks=hooks)


def dense_finetune_runs(config: PruningConfig, classifier_trained: bool) -> bool:
    """Whether :func:`dense_finetune` fine-tunes a model whose classifier is (not) ``classifier_trained``."""
    return _dense_decision(config.dense_finetune, classifier_trained)[0]


def _dense_decision(mode: str, classifier_trained: bool) -> tuple[bool, str]:
    if mode == "always":
        return True, "requested (--dense-finetune always)"
    if mode == "never":
        return False, "turned off (--dense-finetune never)"
    if classifier_trained:
        return False, "the model has a trained classification head for these labels"
    return True, "the model has no trained classification head for the dataset's labels"


def evaluate_validation(run: RunContext, *, model: nn.Module,
                        validation: EncodedDataset) -> tuple[ClassificationMetrics, np.ndarray]:
    """Score the dense model on the validation split: its metrics and its predictions."""
    with run.monitor.stage("dense_evaluation"):
        metrics, predictions = validation_scorer(run, validation=validation, dense=None).score(model)
    run.say(f"dense validation accuracy {metrics.accuracy:.4f}, macro-F1 {metrics.macro_f1:.4f}")
    return metrics, predictions


def budget_search(
    run: RunContext, *, inputs: Inputs, result: SelectionResult, shared: SearchInputs, book: ScoreBook | None = None,
) -> BudgetOutcome:
    """The accuracy budget's search (:func:`cahp_engine.run._budget.search`) over ``result``'s analysis.

    ``shared``: what every candidate shares (:func:`search_inputs`); the search adds its progress to it.

    Reads the validation split and the training rows only, never the evaluation split.
    """
    config = run.config
    assert inputs.held_out is not None
    steps = ladder(result.analysis, tuple(config.budget_strategies), seed=config.seed, knee=result.k_star)
    train = inputs.train
    batches = -(-len(train) // config.batch_size)
    judged = judges_budget(config)
    # Progress over an estimate: each strategy's candidate, about log2(steps + 1) rounds and the last one's end;
    # judged after reconstruction, the scoring's share of the stage first, then about two fine-tunings.
    share = (0.3 if finetunes(config) else 0.99) if judged else 0.0
    expected = max(1, int(batches * config.epochs * (2 if judged else len(config.budget_strategies)
                                                     * (np.log2(len(steps) + 1) + 1))))
    done = [0]

    def taken(n: int) -> None:
        done[0] += n
        run.overall("budget", min(0.99, share + (0.99 - share) * done[0] / expected))

    shared = dataclasses.replace(shared, progress=lambda _step, _total: taken(1), steps_done=taken)
    with run.monitor.stage("budget"):
        if judged:
            lazy = LazyScores(steps, shared, say=run.say, keeping=ScoreKeeping(
                book, scored=lambda n, total: run.overall("budget", share * n / max(1, total))))
            return judged_search(lazy, validation=inputs.held_out, executor=run.candidates)
        return search(steps, shared, validation=inputs.held_out, executor=run.candidates, say=run.say)


def search_inputs(run: RunContext, *, inputs: Inputs, teacher: TeacherLogits | None,
                  dense_validation: ClassificationMetrics, dense_predictions: np.ndarray) -> SearchInputs:
    """What every candidate of the budget's search shares (the same wherever a candidate runs); the dense model is
    ``inputs.loaded.model`` (dense fine-tuning, when it ran, trained it in place)."""
    config = run.config
    assert inputs.validation is not None and config.max_accuracy_drop is not None
    return SearchInputs(
        dense=inputs.loaded.model, train=inputs.train, validation=inputs.validation, dense_validation=dense_validation,
        dense_predictions=dense_predictions, teacher=teacher, class_weights=class_weights(config, inputs.train),
        config=config, device=run.device,
        threshold=score_of(dense_validation, config.budget_metric) - config.max_accuracy_drop / 100.0,
        should_cancel=run.should_cancel)


def recall_warnings(dense: ClassificationMetrics, pruned: ClassificationMetrics,
                    label_names: tuple[str, ...]) -> list[str]:
    """A warning for each class whose recall fell to zero or by more than 20 points from the dense model's."""
    out: list[str] = []
    for i, (was, now) in enumerate(zip(dense.recall, pruned.recall, strict=False)):
        if was is None or now is None:
            continue
        name = label_names[i] if i < len(label_names) else str(i)
        if now == 0.0 and was > 0.0:
            out.append(f"class {name!r} is lost: its recall fell from {was:.1%} to 0 after pruning and recovery")
        elif was - now > RECALL_DROP_WARNING + 1e-9:  # 20 points exactly is not more than 20
            out.append(f"class {name!r}: recall fell from {was:.1%} to {now:.1%} after pruning and recovery "
                       f"(more than {RECALL_DROP_WARNING:.0%})")
    return out


#: A class's recall may fall by this much (a share) before the run warns.
RECALL_DROP_WARNING = 0.20
