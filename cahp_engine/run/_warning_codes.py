"""A stable code for each of a run's warnings, so a CI gate can fail on some and not on others.

The messages are for people and may be reworded; the codes are a contract: ``warning_codes[i]`` in the
report's summary (and so in the job's result, its events and webhooks) names ``warnings[i]``. A quality
flag's code comes from the flag itself; other warnings are matched by the wording of the function that
writes them (each pairing is tested against that function's output).

=====================  ===========================================================================
``class_lost``         a model never predicts a class the evaluation split holds, or a class's recall fell to 0
``near_chance``        a model's macro-F1 is near what guessing without reading the text reaches
``accuracy_drop``      the pruned model lost more accuracy than the budget or the threshold allows
``macro_f1_drop``      the pruned model lost more macro-F1 than a macro-F1 budget allows
``int8_accuracy_drop`` the int8 graph lost more accuracy against the pruned model than allowed
``recall_drop``        a class's recall fell by more than 20 points
``untrained_head``     the classifier head is untrained and dense fine-tuning is off
``no_knee``            Kneedle found no knee; the chord's farthest point was used
``no_stability``       too few samples per class to measure the selection's stability
``budget_noise``       the validation split cannot tell the accuracy budget from noise
``validation_seen``    the validation rows carved from the training split are likely rows the dense model learnt
``target_missed``      the pruned model measured below the speed target asked
``other``              any other warning
=====================  ===========================================================================
"""

from __future__ import annotations

from collections.abc import Sequence

from cahp_engine.run._quality import QualityFlag

#: Every code a warning can have, in the order of the table above.
WARNING_CODES = ("class_lost", "near_chance", "accuracy_drop", "macro_f1_drop", "int8_accuracy_drop",
                 "recall_drop", "untrained_head", "no_knee", "no_stability", "budget_noise",
                 "validation_seen", "target_missed", "other")

#: (code, words the message holds), tried in order, for warnings that are not quality flags.
_WORDED = (
    ("class_lost", " is lost: its recall fell"),
    ("recall_drop", ": recall fell from "),
    ("untrained_head", "classifier head is untrained and dense fine-tuning is off"),
    ("no_knee", "Kneedle found no knee"),
    ("no_stability", "no stability measure"),
    ("budget_noise", "cannot tell a "),
    ("validation_seen", "likely been fine-tuned on them"),
    ("target_missed", " was not met: the pruned model measured "),
)


def flag_code(flag: QualityFlag) -> str:
    """The code of one quality flag."""
    if flag.kind == "missing_classes":
        return "class_lost"
    if flag.kind == "accuracy_drop" and flag.model == "onnx-int8":
        return "int8_accuracy_drop"
    return flag.kind if flag.kind in WARNING_CODES else "other"


def warning_code(message: str) -> str:
    """The code of a warning that is not a quality flag (``other`` when none fits)."""
    for code, words in _WORDED:
        if words in message:
            return code
    return "other"


def code_warnings(warnings: Sequence[str], flags: Sequence[QualityFlag]) -> tuple[str, ...]:
    """One code per warning, in order: a flag's own where the warning is a flag's message."""
    by_message = {flag.message: flag_code(flag) for flag in flags}
    return tuple(by_message.get(message) or warning_code(message) for message in warnings)
