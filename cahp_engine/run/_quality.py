"""Quality checks a deployer cannot miss: a model that never predicts a class, scores near chance, or fell too far.

Every model the run hands out is checked on the evaluation split: the dense model (after dense
fine-tuning, if it ran: a broken dense model makes every pruned copy broken too), the pruned model after
recovery, and its int8 graph. A flag is raised when a model

- never predicts a class the split holds (``missing_classes``);
- has a macro-F1 near chance (``near_chance``): below chance plus :data:`NEAR_CHANCE_SHARE` of the way
  from chance to perfect, where chance is the best macro-F1 a guess reaches without reading the text
  (a uniform random guess, a guess in the classes' proportions, or always the largest class);
- lost more accuracy than allowed (``accuracy_drop``): the pruned model against the dense one, by more
  than the accuracy budget when one was set, else :data:`MAX_ACCURACY_DROP`; the int8 graph against the
  pruned model by more than :data:`MAX_INT8_DROP`;
- lost more macro-F1 than a macro-F1 budget allows (``macro_f1_drop``); its accuracy is then held to
  :data:`MAX_ACCURACY_DROP`, since the budget traded accuracy on purpose.

The flags' messages join the run's ``warnings`` (so the job's result, the webhook, ``cahp wait`` and
the console show them) and open the model cards. Importable without torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cahp_engine.recovery import ClassificationMetrics
from cahp_engine.results import JsonRecord

#: "Near chance" ends this share of the way from chance macro-F1 to a perfect 1.
NEAR_CHANCE_SHARE = 0.10
#: Accuracy (a share) the pruned model may lose against the dense one without a budget before a flag.
MAX_ACCURACY_DROP = 0.05
#: Accuracy the int8 graph may lose against the pruned PyTorch model before a flag.
MAX_INT8_DROP = 0.02


@dataclass(frozen=True)
class QualityFlag(JsonRecord):
    """One problem with one model.

    ``model`` is ``dense``, ``pruned`` or ``onnx-int8``; ``kind`` is ``missing_classes``,
    ``near_chance``, ``accuracy_drop`` or ``macro_f1_drop``; ``classes`` names the classes concerned (missing ones).
    """

    model: str
    kind: str
    message: str
    classes: tuple[str, ...] = ()


@dataclass(frozen=True)
class QualityRecord(JsonRecord):
    """``report.json``'s ``quality``: the checks' thresholds and what they flagged.

    Attributes
    ----------
    chance_macro_f1 : float
        The best macro-F1 of a guess that reads no text, on the evaluation split's classes.
    near_chance_below : float
        A macro-F1 below this is flagged as near chance.
    max_accuracy_drop : float
        Accuracy (a share) the pruned model may lose against the dense one: the budget's P / 100, or
        :data:`MAX_ACCURACY_DROP` (``drop_rule`` says which).
    drop_rule : {"budget", "threshold"}
    drop_metric : {"accuracy", "macro_f1"}
        What ``max_accuracy_drop`` bounds: the budget's metric. With a macro-F1 budget the pruned
        model's accuracy is still flagged beyond :data:`MAX_ACCURACY_DROP`, which nothing budgeted.
    max_int8_drop : float
    flags : tuple of QualityFlag
        Empty when every check passed.
    """

    chance_macro_f1: float
    near_chance_below: float
    max_accuracy_drop: float
    drop_rule: str
    max_int8_drop: float
    flags: tuple[QualityFlag, ...]
    drop_metric: str = "accuracy"

    @property
    def messages(self) -> tuple[str, ...]:
        return tuple(flag.message for flag in self.flags)


def chance_macro_f1(support: Sequence[int]) -> float:
    """The best expected macro-F1 of a guess that ignores its input, for classes of these sizes.

    Of a uniform random guess (class ``c`` with probability 1/C), a random guess in the classes'
    proportions (expected macro-F1 1/C) and the constant guess of the largest class.
    """
    counts = [int(n) for n in support]
    total, classes = sum(counts), len(counts)
    if total == 0 or classes == 0:
        return 0.0
    shares = [n / total for n in counts]
    uniform = sum(2 * p / (classes * p + 1) for p in shares) / classes
    largest = max(shares)
    constant = 2 * largest / (1 + largest) / classes
    return max(uniform, 1 / classes, constant)


@dataclass(frozen=True)
class AccuracyBudget:
    """The accuracy budget the pruned model is held to: ``points`` of ``metric`` (``accuracy`` or ``macro_f1``)
    below the dense model's."""

    points: float
    metric: str = "accuracy"


def assess_quality(
    *,
    dense: ClassificationMetrics,
    pruned: ClassificationMetrics | None,
    int8: ClassificationMetrics | None,
    label_names: Sequence[str],
    budget: AccuracyBudget | None,
) -> QualityRecord:
    """Check each model's scores on the evaluation split (see the module's description).

    Parameters
    ----------
    dense, pruned, int8 : the models' scores on the same split (int8: None without one); their
        confusion matrices say which classes the split holds and which each model predicts. ``pruned``
        is None for a run that kept no pruned model (one that missed its accuracy budget): then the
        dense model alone is checked, for missing classes and a macro-F1 near chance
    label_names : names of the classes, index i for class i
    budget : the accuracy budget, or None (the pruned model is then held to :data:`MAX_ACCURACY_DROP`)
    """
    max_accuracy_drop = None if budget is None else budget.points
    support = _support(dense)
    chance = chance_macro_f1(support)
    below = chance + NEAR_CHANCE_SHARE * (1 - chance)
    allowed, rule = ((max_accuracy_drop / 100, "budget") if max_accuracy_drop is not None
                     else (MAX_ACCURACY_DROP, "threshold"))
    metric = budget.metric if budget is not None else "accuracy"
    flags: list[QualityFlag] = []
    models = [("dense", "the dense model", dense)]
    if pruned is not None:
        models.append(("pruned", "the pruned model", pruned))
    if int8 is not None:
        models.append(("onnx-int8", "the int8 ONNX model", int8))
    for key, words, metrics in models:
        flags += _missing(key, words, metrics, support, label_names)
        if metrics.macro_f1 < below:
            flags.append(QualityFlag(key, "near_chance", (
                f"{words} scores near chance: macro-F1 {metrics.macro_f1:.3f}, where guessing without reading "
                f"the text reaches {chance:.3f} (flagged below {below:.3f})"
                + ("; fine-tune it first with `dense_finetune=always`" if key == "dense" else ""))))
    if pruned is not None:
        flags += _drops(dense, pruned, int8, max_accuracy_drop=max_accuracy_drop, metric=metric)
    return QualityRecord(chance_macro_f1=chance, near_chance_below=below, max_accuracy_drop=allowed, drop_rule=rule,
                         max_int8_drop=MAX_INT8_DROP, flags=tuple(flags), drop_metric=metric)


def _drops(dense: ClassificationMetrics, pruned: ClassificationMetrics, int8: ClassificationMetrics | None, *,
           max_accuracy_drop: float | None, metric: str) -> list[QualityFlag]:
    """The pruned model's drop from the dense one beyond the budget (else the threshold), and the int8 graph's from
    the pruned one.

    With a macro-F1 budget (``metric``), macro-F1 is held to the budget and accuracy to the threshold.
    """
    allowed = MAX_ACCURACY_DROP if max_accuracy_drop is None else max_accuracy_drop / 100
    flags: list[QualityFlag] = []
    if metric == "macro_f1":
        f1_drop = dense.macro_f1 - pruned.macro_f1
        if f1_drop > allowed + 1e-12:
            flags.append(QualityFlag("pruned", "macro_f1_drop", (
                f"the pruned model's macro-F1 {pruned.macro_f1:.2%} is {100 * f1_drop:.1f} points below the dense "
                f"model's {dense.macro_f1:.2%} on the evaluation split, more than the macro-F1 budget of "
                f"{max_accuracy_drop:g} points")))
        allowed, max_accuracy_drop = MAX_ACCURACY_DROP, None
    drop = dense.accuracy - pruned.accuracy
    if drop > allowed + 1e-12:
        limit = (f"the accuracy budget of {max_accuracy_drop:g} points" if max_accuracy_drop is not None
                 else f"{100 * allowed:g} points")
        flags.append(QualityFlag("pruned", "accuracy_drop", (
            f"the pruned model's accuracy {pruned.accuracy:.2%} is {100 * drop:.1f} points below the dense "
            f"model's {dense.accuracy:.2%} on the evaluation split, more than {limit}")))
    if int8 is not None and pruned.accuracy - int8.accuracy > MAX_INT8_DROP + 1e-12:
        flags.append(QualityFlag("onnx-int8", "accuracy_drop", (
            f"the int8 ONNX model's accuracy {int8.accuracy:.2%} is {100 * (pruned.accuracy - int8.accuracy):.1f} "
            f"points below the pruned model's {pruned.accuracy:.2%}, more than {100 * MAX_INT8_DROP:g} points")))
    return flags


def _support(metrics: ClassificationMetrics) -> list[int]:
    if metrics.confusion is None:
        return []
    return [sum(row) for row in metrics.confusion]


def _missing(key: str, words: str, metrics: ClassificationMetrics, support: Sequence[int],
             label_names: Sequence[str]) -> list[QualityFlag]:
    """A flag when the model predicts no row as some class the split holds."""
    if metrics.confusion is None:
        return []
    predicted = [sum(column) for column in zip(*metrics.confusion, strict=True)]
    never = [c for c, n in enumerate(support) if n > 0 and c < len(predicted) and predicted[c] == 0]
    if not never:
        return []
    names = tuple(label_names[c] if c < len(label_names) else str(c) for c in never)
    present = sum(1 for n in support if n > 0)
    return [QualityFlag(key, "missing_classes", (
        f"{words} never predicts {', '.join(repr(n) for n in names)}: it predicts {present - len(never)} of the "
        f"{present} classes of the evaluation split"), names)]
