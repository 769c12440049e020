"""Training a classifier, dense or pruned, and measuring it: fine-tuning, distillation, evaluation.

Reading order: ``_distillation`` (the teacher's logits and loss) -> ``_training`` (``finetune``)
-> ``_evaluation`` (accuracy, size, speed)."""

from ._distillation import TeacherLogits, distillation_loss, teacher_logits
from ._evaluation import (
    check_counts,
    classification_metrics,
    compare_speed,
    count_parameters,
    evaluate,
    max_positions,
    measure_latency,
    random_inputs,
)
from ._training import AuxiliaryLoss, finetune

__all__ = [
    "AuxiliaryLoss", "check_counts", "classification_metrics", "compare_speed", "count_parameters",
    "distillation_loss", "evaluate", "finetune", "max_positions", "measure_latency", "random_inputs",
    "teacher_logits", "TeacherLogits",
]
