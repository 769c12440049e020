"""What a pruned model is and how it was made: ``report.json``'s ``identity`` and ``recipe``.

A model registry, a model card and a deployer all ask the same questions of a model: which model was
pruned (by name: the hub id, the checkpoint's own ``_name_or_path``, else the directory's or archive's
name), on which dataset and classes, by which job (and the labels the caller gave it, such as the git
commit), by which release of cahp, and with which recipe (whether cahp made and trained a new
classification head, the selection, the recovery with its loss, epochs, seed and rows, early stopping).
:class:`RunIdentity` is what a caller knows that the inputs cannot say (the job service passes the
job's id, name and labels, and the names of uploaded archives); :func:`identity_of` and
:func:`recipe_of` put it together with what the run read and did. Importable without torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from cahp_engine.export import is_hub_id
from cahp_engine.results import JsonRecord


@dataclass(frozen=True)
class RunIdentity(JsonRecord):
    """What the caller of a run knows about it that its inputs cannot say; every field optional.

    Attributes
    ----------
    name : str or None
        The model's name, e.g. a job's ``name``: the cards' title.
    job_id : str or None
        The job that ran it.
    labels : dict of str to str
        The caller's labels (``git/commit``, ``branch``...).
    base_model, dataset : str or None
        Display names of the inputs when their references do not carry one (an uploaded archive's name).
    base_model_hub_id, dataset_hub_id : str or None
        Their Hugging Face hub ids, when the caller fetched them from the hub.
    """

    name: str | None = None
    job_id: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    base_model: str | None = None
    base_model_hub_id: str | None = None
    dataset: str | None = None
    dataset_hub_id: str | None = None


@dataclass(frozen=True)
class Identity(JsonRecord):
    """``report.json``'s ``identity``: what the pruned model is.

    Attributes
    ----------
    name : str or None
        The name the caller gave it (a job's ``name``).
    base_model : str
        The dense model by name: its hub id, else its checkpoint's ``_name_or_path``, else the name of
        the directory or archive it came in.
    base_model_hub_id : str or None
        The hub id when there is one (what the card's ``base_model`` metadata names).
    dataset, dataset_hub_id : str, str or None
        The same for the dataset.
    class_names : tuple of str
        ``class_names[i]`` names class ``i`` (the model's ``id2label``).
    job_id : str or None
    labels : dict of str to str
    cahp_version : str or None
    """

    name: str | None
    base_model: str
    base_model_hub_id: str | None
    dataset: str
    dataset_hub_id: str | None
    class_names: tuple[str, ...]
    job_id: str | None
    labels: dict[str, str]
    cahp_version: str | None


def identity_of(given: RunIdentity | None, *, model_ref: str, dataset_ref: str,
                class_names: tuple[str, ...]) -> Identity:
    """The run's :class:`Identity` from what the caller gave and what the inputs say.

    ``model_ref`` and ``dataset_ref`` are what the run read: a local directory or a hub id.
    """
    given = given or RunIdentity()
    local_model = Path(model_ref).is_dir()
    declared = _name_or_path(Path(model_ref)) if local_model else None
    model_hub = (given.base_model_hub_id or (model_ref if not local_model and is_hub_id(model_ref) else None)
                 or (declared if is_hub_id(declared) else None))
    declared_name = Path(declared).name if declared else None
    base_model = model_hub or declared_name or given.base_model or _tail(model_ref)
    local_data = Path(dataset_ref).exists()
    data_hub = given.dataset_hub_id or (dataset_ref if not local_data and is_hub_id(dataset_ref) else None)
    return Identity(
        name=given.name,
        base_model=base_model,
        base_model_hub_id=model_hub,
        dataset=data_hub or given.dataset or _tail(dataset_ref),
        dataset_hub_id=data_hub,
        class_names=tuple(class_names),
        job_id=given.job_id,
        labels=dict(given.labels),
        cahp_version=cahp_version(),
    )


def cahp_version() -> str | None:
    try:
        return metadata.version("cahp")
    except metadata.PackageNotFoundError:
        return None


def _tail(ref: str) -> str:
    return Path(ref.rstrip("/")).name or ref


def _name_or_path(directory: Path) -> str | None:
    """``_name_or_path`` as the checkpoint's ``config.json`` records it (transformers 4 wrote the model it
    was fine-tuned from there; transformers 5 writes none)."""
    try:
        value = json.loads((directory / "config.json").read_text()).get("_name_or_path")
    except (OSError, ValueError, AttributeError):
        return None
    return value.strip() if isinstance(value, str) and value.strip() else None


@dataclass(frozen=True)
class TrainingSummary(JsonRecord):
    """One fine-tuning as it was asked for and as it went.

    ``epochs`` asked for, ``epochs_trained`` made; ``loss`` is ``ce`` or ``distill`` (with
    ``distill_alpha`` and ``distill_temperature``); ``class_weighted`` when each class weighed by its
    rarity; ``early_stopping_patience`` 0 means fixed epochs, else ``best_epoch`` is the epoch whose
    weights were kept and ``stopped_early`` whether it stopped before the last.
    """

    epochs: float
    epochs_trained: float
    lr: float
    batch_size: int
    warmup_ratio: float
    weight_decay: float
    loss: str
    distill_alpha: float | None
    distill_temperature: float | None
    class_weighted: bool
    early_stopping_patience: int
    best_epoch: float | None
    stopped_early: bool


@dataclass(frozen=True)
class Recipe(JsonRecord):
    """``report.json``'s ``recipe``: how the pruned model was made, in one place.

    Attributes
    ----------
    classifier_head : {"checkpoint", "new"}
        ``new`` when cahp created the classification head for the dataset's labels (and trained it
        in ``dense_finetune`` unless that was off).
    dense_finetune : TrainingSummary or None
        The dense fine-tuning before selection, when it ran.
    strategy, poly_degree, k_star, heads_kept, heads_total : the selection
    max_accuracy_drop : float or None
        The accuracy budget, in points, when one chose the head count.
    recovery : TrainingSummary or None
        None in the report of a run that missed its accuracy budget: it kept no recovered model (each
        candidate's training is in the report's ``budget``), and the selection is the knee's choice.
    seed, max_length : int
    train_rows, eval_rows : int
    eval_split : str or None
    export, quantize : str
    reconstruction : str or None
        The layer-wise reconstruction in words, when the run reconstructed (``recovery`` reconstruct or
        reconstruct+finetune).
    target : str or None
        A speed or FLOPs target's allocation in words (the heads and neurons kept per layer, the
        predicted and measured speed-up), when the run had one.
    """

    classifier_head: str
    dense_finetune: TrainingSummary | None
    strategy: str
    poly_degree: int
    k_star: int
    heads_kept: int
    heads_total: int
    max_accuracy_drop: float | None
    recovery: TrainingSummary | None
    seed: int
    max_length: int
    train_rows: int
    eval_rows: int
    eval_split: str | None
    export: str
    quantize: str
    reconstruction: str | None = None
    target: str | None = None

    def lines(self) -> tuple[str, ...]:
        """The recipe in words, one step a line (the model cards' "How it was made")."""
        out = ["classification head: " + ("created by cahp for the dataset's classes"
                                          if self.classifier_head == "new" else "the checkpoint's own")]
        if self.dense_finetune is not None:
            out.append("dense fine-tuning before selection: " + _training_text(self.dense_finetune))
        budget = (f", the fewest heads within {self.max_accuracy_drop:g} points of dense accuracy"
                  if self.max_accuracy_drop is not None else "")
        if self.target is not None:
            out.append(f"selection: `{self.strategy}` chose which heads fill each layer's count, {self.heads_kept} of "
                       f"{self.heads_total} heads kept")
            out.append(self.target)
        else:
            out.append(f"selection: `{self.strategy}`, Kneedle polynomial degree {self.poly_degree}, k* = "
                       f"{self.k_star}, {self.heads_kept} of {self.heads_total} heads kept{budget}")
        if self.reconstruction is not None:
            out.append("layer-wise reconstruction: " + self.reconstruction)
        if self.recovery is not None and self.recovery.epochs == 0 and self.reconstruction is not None:
            out.append("recovery fine-tuning: none (the reconstructed weights are the model)")
        else:
            out.append("recovery fine-tuning: " + (_training_text(self.recovery) if self.recovery is not None
                                                   else "none kept: no candidate met the accuracy budget"))
        split = f" (split `{self.eval_split}`)" if self.eval_split else ""
        out.append(f"seed {self.seed}; {self.train_rows} training rows, {self.eval_rows} evaluation rows{split}; "
                   f"inputs up to {self.max_length} tokens")
        return tuple(out)


def _training_text(t: TrainingSummary) -> str:
    loss = ("distillation from the dense model "
            f"(alpha {t.distill_alpha:g}, temperature {t.distill_temperature:g})"
            if t.loss == "distill" and t.distill_alpha is not None and t.distill_temperature is not None
            else "cross-entropy")
    text = f"{t.epochs_trained:g} of {t.epochs:g} epochs at lr {t.lr:g}, batch {t.batch_size}, {loss}"
    if t.class_weighted:
        text += ", class-balanced"
    if t.early_stopping_patience > 0:
        best = f"kept the weights of epoch {t.best_epoch:g}" if t.best_epoch is not None else "kept the best weights"
        text += (f"; early stopping (patience {t.early_stopping_patience}) {best}"
                 + (", stopped early" if t.stopped_early else ""))
    return text


def _training_summary(config: Any, training: Any, *, epochs: float, lr: float) -> TrainingSummary:
    distill = training.loss == "distill"
    return TrainingSummary(
        epochs=float(epochs), epochs_trained=float(training.epochs), lr=float(lr), batch_size=int(config.batch_size),
        warmup_ratio=float(config.warmup_ratio), weight_decay=float(config.weight_decay), loss=str(training.loss),
        distill_alpha=training.alpha if distill else None,
        distill_temperature=training.temperature if distill else None,
        class_weighted=training.class_weights is not None,
        early_stopping_patience=int(training.early_stopping_patience),
        best_epoch=training.best_epoch, stopped_early=bool(training.stopped_early),
    )


def recipe_of(report: Any) -> Recipe:
    """The :class:`Recipe` of a finished :class:`~cahp_engine.run.RunReport`, or of a
    :class:`~cahp_engine.run.FailedRunReport` (which has no ``recovery``: its recipe's is None)."""
    config, selection, dense = report.config, report.selection, report.dense_finetune
    recovery = getattr(report, "recovery", None)
    rebuilt, target = getattr(report, "reconstruction", None), getattr(report, "target", None)
    epochs = 0.0 if getattr(config, "recovery", "finetune") == "reconstruct" else config.epochs
    return Recipe(
        classifier_head="checkpoint" if report.model.classifier_trained else "new",
        dense_finetune=(_training_summary(config, dense.training, epochs=config.dense_epochs, lr=config.dense_lr)
                        if dense.ran and dense.training is not None else None),
        strategy=selection.strategy, poly_degree=selection.poly_degree, k_star=selection.k_star,
        heads_kept=selection.heads_kept, heads_total=selection.heads_total,
        max_accuracy_drop=config.max_accuracy_drop,
        recovery=(_training_summary(config, recovery, epochs=epochs, lr=config.lr)
                  if recovery is not None else None),
        seed=config.seed, max_length=config.max_length, train_rows=report.dataset.train_rows,
        eval_rows=report.dataset.eval_rows, eval_split=report.dataset.eval_split, export=config.export,
        quantize=config.quantize,
        reconstruction=None if rebuilt is None else (
            f"the {_refit_parts(rebuilt)} of each layer refit by {rebuilt.method} least squares "
            f"({_refit_targets(rebuilt)}) on {rebuilt.rows} calibration tokens, in {rebuilt.seconds:.1f} s"),
        target=None if target is None else (
            f"{target.headline()}; heads per layer {list(target.heads_per_layer)} of {target.heads_total}, "
            f"feed-forward neurons per layer {list(target.neurons_per_layer)} of {target.neurons_total}"),
    )


def _refit_targets(rebuilt: Any) -> str:
    """What the refit projections matched, in words."""
    ffn = getattr(rebuilt, "ffn_target", None)
    if ffn is None or "ffn" not in {fit.sublayer for fit in rebuilt.fits}:
        return f"{rebuilt.target} target"
    return f"{rebuilt.target} targets" if ffn == rebuilt.target else f"{rebuilt.target} and {ffn} targets"


def _refit_parts(rebuilt: Any) -> str:
    """What a reconstruction refit, in words."""
    if "ffn" in {fit.sublayer for fit in rebuilt.fits}:
        return "attention and feed-forward output projections"
    return "attention output projection"
