"""Whether a classification head that is there does anything: a head that scores near chance is untrained.

``dense_finetune: auto`` fine-tunes the dense model when it has no trained head for the dataset's labels.
A head's weights being in the checkpoint is not enough: ``from_pretrained(num_labels=5)`` saves a random
head like any other. So a present head is scored on the evaluation split first, and taken for untrained
when its macro-F1 is near chance (:func:`cahp_engine.run._quality.assess_quality`'s rule) or its accuracy
is no more than :data:`MAJORITY_MARGIN` above always guessing the largest class.
"""

from __future__ import annotations

from cahp_engine.recovery import ClassificationMetrics
from cahp_engine.run._quality import NEAR_CHANCE_SHARE, chance_macro_f1

#: A head whose accuracy is not this much (a share) above the largest class's share does not read the text.
MAJORITY_MARGIN = 0.01


def untrained_in_effect(metrics: ClassificationMetrics) -> str | None:
    """Why the head that scored ``metrics`` counts as untrained, or None when it reads the text.

    Parameters
    ----------
    metrics : ClassificationMetrics
        The dense model's scores on the evaluation split, with its confusion matrix of shape (C, C).
    """
    if metrics.confusion is None:
        return None
    support = [sum(row) for row in metrics.confusion]
    total = sum(support)
    if total == 0:
        return None
    chance = chance_macro_f1(support)
    near = chance + NEAR_CHANCE_SHARE * (1 - chance)
    majority = max(support) / total
    if metrics.macro_f1 < near:
        return (f"its classification head scores near chance on the evaluation split (macro-F1 {metrics.macro_f1:.3f}, "
                f"flagged below {near:.3f}): it is taken for untrained")
    if metrics.accuracy < majority + MAJORITY_MARGIN:
        return (f"its classification head is no better than always guessing the largest class on the evaluation "
                f"split (accuracy {metrics.accuracy:.1%}, the largest class {majority:.1%}, margin "
                f"{MAJORITY_MARGIN:.0%}): it is taken for untrained")
    return None
