"""Training a classifier, dense or pruned, and measuring it: fine-tuning, distillation, evaluation.

Reading order: ``_distillation`` (the teacher's logits and loss) -> ``_recipe`` (``TrainingRecipe``, parameter
groups, loss) -> ``_best`` (``ValidationWatch``, the best weights and early stopping) -> ``_training``
(``FineTuning``, ``finetune``, ``FineTuningHooks``)
-> ``_training_records`` -> ``_resume`` (a fine-tuning's state on disk) -> ``_evaluation`` (accuracy, size,
speed) and ``_evaluation_records``
-> ``_bootstrap`` (the noise of a drop in score) -> ``_least_squares`` and ``_reconstruction`` (layer-wise
reconstruction: recovery without gradient training)."""

from ._best import BestWeights, Rank, ValidationWatch, Validator, default_rank
from ._bootstrap import BOOTSTRAP_RESAMPLES, drop_interval, metric_of_predictions
from ._distillation import Distillation, TeacherLogits, distillation_loss, teacher_logits
from ._evaluation import (
    check_counts,
    classification_metrics,
    compare_speed,
    count_parameters,
    evaluate,
    latency_of,
    max_positions,
    measure_latency,
    predict,
    random_inputs,
    speedup_interval,
)
from ._evaluation_records import (
    ClassificationMetrics,
    Latency,
    ParameterCounts,
    SpeedComparison,
    SpeedRow,
)
from ._recipe import AuxiliaryLoss, TrainingRecipe, balanced_class_weights
from ._reconstruction import (
    METHODS,
    SUBLAYERS,
    TARGETS,
    ReconstructionOptions,
    reconstruct,
    unsupported_reason,
)
from ._reconstruction_records import LayerFit, Reconstruction
from ._resume import TRAINING_FILES, load_training_state, save_training_state
from ._training import FineTuning, FineTuningHooks, finetune
from ._training_records import TeacherRecord, TrainingResult

__all__ = [
    "TeacherRecord", "TrainingResult", "TrainingRecipe", "Distillation", "ValidationWatch", "FineTuningHooks",
    "ClassificationMetrics", "Latency", "ParameterCounts", "SpeedComparison", "SpeedRow",
    "AuxiliaryLoss", "balanced_class_weights", "BestWeights", "BOOTSTRAP_RESAMPLES", "check_counts",
    "classification_metrics", "compare_speed", "count_parameters", "default_rank", "distillation_loss",
    "drop_interval", "evaluate", "FineTuning", "finetune", "latency_of", "load_training_state", "max_positions",
    "measure_latency",
    "metric_of_predictions", "METHODS", "predict", "random_inputs", "Rank", "reconstruct", "Reconstruction",
    "ReconstructionOptions", "LayerFit", "SUBLAYERS", "TARGETS", "unsupported_reason", "save_training_state",
    "speedup_interval",
    "teacher_logits", "TRAINING_FILES",
    "TeacherLogits", "Validator",
]
