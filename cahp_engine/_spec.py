"""Every setting of a run, declared once: its default, its rule, its help, and where a user sets it.

:data:`SETTINGS` is read by :class:`~cahp_engine.config.PruningConfig` (its defaults and its checks),
by the job API's ``JobParams`` (a description and the bounds in the OpenAPI schema) and by
``cahp prune`` (one flag each, with its help). A setting declared here is on every surface in its
``surfaces``; a test checks that they agree. Rules that span two settings (``max_accuracy_drop``
against ``heads_to_keep``, ``quantize`` against ``export``) stay in ``PruningConfig.__post_init__``.

Light: importable without torch or numpy (the command line and the service build from it).
Published through :mod:`cahp_engine.config`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, TypeVar, get_args

from cahp_engine._strategy_names import STRATEGIES
from cahp_engine._validation import Amount, Constraint, Device, Interval, OffOr, Options, SubsetOf, TupleOf

if TYPE_CHECKING:
    Strategy = str
else:
    #: The strategy names (:data:`cahp_engine._strategy_names.STRATEGY_MODULES`), as a type: the job
    #: API's schema lists them.
    Strategy = Literal[STRATEGIES]
DenseFinetune = Literal["auto", "always", "never"]
#: ``signature_samples``: a count, a fraction of the training split (1.0 is every row), ``"all"``, or
#: ``"auto"`` (the stopping rule of :mod:`cahp_engine.selection._convergence` decides).
SampleAmount = int | float | Literal["auto", "all"]
#: ``calibration_fraction``: a fraction of the training split, or ``"auto"`` (the stopping rule decides).
CalibrationAmount = float | Literal["auto"]
ExportFormat = Literal["onnx", "none"]
Quantize = Literal["none", "int8"]
RecoveryLoss = Literal["ce", "distill"]
#: ``recovery``: gradient fine-tuning (the paper's), layer-wise reconstruction alone (no training), or
#: reconstruction and then fine-tuning from the reconstructed weights.
RecoveryMode = Literal["finetune", "reconstruct", "reconstruct+finetune"]
BudgetMetric = Literal["accuracy", "macro_f1"]
#: ``budget_objective``: what an accuracy budget minimises within P: the heads kept, or the serving time.
BudgetObjective = Literal["heads", "speed"]
#: ``budget_search``: how an accuracy budget judges its candidates: every one fine-tuned (successive halving),
#: or scored after layer-wise reconstruction and only the few the scores point at fine-tuned; ``auto`` judges
#: after reconstruction when ``recovery`` reconstructs.
BudgetSearch = Literal["auto", "judged", "halving"]
#: ``target_runtime``: the serving runtime a speed target is measured on (PyTorch fp32, onnxruntime fp32 or int8).
TargetRuntime = Literal["pytorch", "ort-fp32", "ort-int8"]
#: ``target_seq_len``: the serving length in tokens, or the 95th percentile of the calibration rows' lengths.
TargetLength = int | Literal["p95"]
ClassWeight = Literal["none", "balanced"]

#: ``untrained_dense``: what ``dense_finetune: never`` does with a dense model that scores near chance.
UntrainedDense = Literal["fail", "warn"]
DENSE_FINETUNE_MODES: tuple[str, ...] = get_args(DenseFinetune)
UNTRAINED_DENSE: tuple[str, ...] = get_args(UntrainedDense)
RECOVERY_LOSSES: tuple[str, ...] = get_args(RecoveryLoss)
RECOVERY_MODES: tuple[str, ...] = get_args(RecoveryMode)
BUDGET_METRICS: tuple[str, ...] = get_args(BudgetMetric)
BUDGET_OBJECTIVES: tuple[str, ...] = get_args(BudgetObjective)
BUDGET_SEARCHES: tuple[str, ...] = get_args(BudgetSearch)
TARGET_RUNTIMES: tuple[str, ...] = get_args(TargetRuntime)
CLASS_WEIGHTS: tuple[str, ...] = get_args(ClassWeight)
#: The strategies whose choices are an accuracy budget's candidates unless the user names others.
BUDGET_STRATEGIES: tuple[str, ...] = ("cahp", "salience")
EXPORT_FORMATS: tuple[str, ...] = get_args(ExportFormat)
QUANTIZE_MODES: tuple[str, ...] = get_args(Quantize)
#: Polynomial degrees reported in ``knees_by_degree`` (the paper's sweep, Section IV-B.2).
REPORTED_DEGREES: tuple[int, ...] = (2, 3, 4, 5, 6)

Surface = Literal["cli", "api"]
BOTH: frozenset[Surface] = frozenset({"cli", "api"})


@dataclass(frozen=True)
class Setting:
    """One user-settable value of a run.

    Parameters
    ----------
    name : str
        The :class:`~cahp_engine.config.PruningConfig` field, the job API's ``params`` key; the flag is
        ``--`` and the name with dashes.
    default
        The value when the user sets none.
    rule : Interval, Options, Amount, OffOr, TupleOf or Device
        What a value must be; its words make the message ("`name` must be <rule>, got <value>").
    help : str
        What the setting does, in one line, without the default.
    default_note : str
        What the default does, when its value alone does not say ("stop once the salience ranking is
        reliable"); shown after it.
    nullable : bool
        Whether None is a value (the engine decides, or the feature is off).
    surfaces : frozenset of {"cli", "api"}
        Where a user sets it: ``device`` is the worker's in the service, so only ``cahp prune`` has it.
    group : str or None
        The ``cahp prune --help`` section; None for the general options.
    metavar : str or None
        The flag's placeholder in ``--help`` (argparse's default when None).
    parse : callable or None
        Reads the flag's text (raising ValueError with a message that says what was expected); None
        reads it by the rule (:attr:`from_text`).
    """

    name: str
    default: Any
    rule: Constraint
    help: str
    default_note: str = ""
    nullable: bool = False
    surfaces: frozenset[Surface] = BOTH
    group: str | None = None
    metavar: str | None = None
    parse: Callable[[str], Any] | None = None

    @property
    def flag(self) -> str:
        """The command-line flag (``--poly-degree``)."""
        return "--" + self.name.replace("_", "-")

    @property
    def from_text(self) -> Callable[[str], Any]:
        """How a flag's text becomes a value: ``parse``, else ``int`` or ``float`` by the rule, else the text."""
        if self.parse is not None:
            return self.parse
        rule = self.rule.interval if isinstance(self.rule, OffOr) else self.rule
        if isinstance(rule, Interval):
            return int if rule.kind == "integer" else float
        return str

    def help_with_default(self, shown: str) -> str:
        """The help with the default said at its end, the default written as ``shown``."""
        if self.default is None:
            return f"{self.help} (default: {self.default_note})" if self.default_note else self.help
        note = f": {self.default_note}" if self.default_note else ""
        return f"{self.help} (default {shown}{note})"


def parse_sample_amount(text: str) -> int | float | str:
    """``auto``, ``all``, a count (``2000``) or a fraction (``0.5``; ``1.0`` is every row)."""
    if text in ("auto", "all"):
        return text
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    raise ValueError(f"expected auto, all, a count like 2000 or a fraction like 0.5, got {text!r}")


_N = TypeVar("_N", int, float)


def _word_or(text: str, word: str, convert: Callable[[str], _N], expected: str) -> _N | str:
    """``word`` itself, or ``convert(text)``; a ValueError naming both when it is neither."""
    if text == word:
        return text
    try:
        return convert(text)
    except ValueError:
        raise ValueError(f"expected {word} or {expected}, got {text!r}") from None


def parse_fraction_or_auto(text: str) -> float | str:
    """``auto`` or a fraction (``0.25``)."""
    return _word_or(text, "auto", float, "a fraction like 0.25")


def parse_name_list(text: str) -> tuple[str, ...]:
    """Names separated by commas (``cahp,salience``)."""
    return tuple(part.strip() for part in text.split(","))


def parse_length(text: str) -> int | str:
    """``p95`` or a number of tokens (``64``)."""
    return _word_or(text, "p95", int, "a number of tokens like 64")


def parse_int_list(text: str) -> tuple[int, ...]:
    """Integers separated by commas (``2,3,4``)."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"expected integers separated by commas, like 2,3,4, got {text!r}") from None


_DEGREE = Interval("integer", 1, 10)
_EPOCHS = Interval("real", 0.0, 1000.0)
_RATE = Interval("real", 0.0, 1.0, closed="right")
_UNIT = Interval("real", 0.0, 1.0)

#: Every setting, in :class:`~cahp_engine.config.PruningConfig`'s field order.
SETTINGS: tuple[Setting, ...] = (
    Setting("poly_degree", 2, _DEGREE, "Kneedle polynomial degree", group="selection"),
    Setting("heads_to_keep", None, Interval("integer", 1, None, closed="left"),
            "fix the number of clusters; skips the knee", nullable=True, group="selection"),
    Setting("resolution", None, Interval("integer", 2, 512), "side B of the resized maps",
            "70th percentile of training lengths", nullable=True, group="selection"),
    Setting("calibration_fraction", "auto",
            Amount(Interval("real", 0.0, 1.0, closed="right"), ("auto",), "a number in (0.0, 1.0] or 'auto'"),
            "share of the training split for salience, e.g. the paper's 0.25",
            "stop once the salience ranking is reliable", group="selection", parse=parse_fraction_or_auto),
    Setting("signature_samples", "auto",
            Amount(Interval("real", 0.0, 1.0, closed="right"), ("auto", "all"),
                   "an integer count >= 2, a fraction in (0, 1], 'all' or 'auto'",
                   count=Interval("integer", 2, None, closed="left")),
            "a count, a fraction (1.0 = every row) or all",
            "stop once the class differences of the signatures are mostly signal", group="selection",
            parse=parse_sample_amount),
    Setting("strategy", "cahp", Options(STRATEGIES),
            "cahp is the paper's method; salience and random are baselines keeping as many heads; "
            "coassociation, stability-selection and mean-distance are consensus choices over CAHP's "
            "leave-one-shard-out analyses (they need stability_shards); cahp-layer-salience keeps CAHP's head count in "
            "each layer, filled with that layer's most salient heads", group="selection"),
    Setting("seed", 42, Interval("integer", 0, 2**32 - 1),
            "seeds every random choice: sample draws, t-SNE, FasterPAM, baselines and fine-tuning"),
    Setting("batch_size", 32, Interval("integer", 1, 4096),
            "batch size of every pass: signatures, salience, fine-tuning and evaluation", group="fine-tuning"),
    Setting("max_length", 512, Interval("integer", 2, 8192), "longer inputs are truncated to this many tokens"),
    Setting("perplexity", None, Interval("real", 0.0, 1e6, closed="neither"), "t-SNE perplexity",
            "min(10, (N - 1) / 3) for N heads", nullable=True, group="selection"),
    Setting("var_floor", 1e-6, Interval("real", 0.0, 1.0, closed="neither"),
            "floor on the class variances before the Bhattacharyya distance", group="selection"),
    Setting("stability_shards", 5, OffOr(Interval("integer", 2, 20)),
            "leave-one-shard-out reruns for the stability measure; 0 turns it off", group="selection"),
    Setting("recovery", "finetune", Options(RECOVERY_MODES),
            "finetune: recovery epochs of gradient training; reconstruct: refit each layer's attention and "
            "feed-forward output projections by least squares to match the dense layer (seconds, no training); "
            "reconstruct+finetune: reconstruct, then fine-tune from the refit weights", group="fine-tuning"),
    Setting("reconstruction_rows", 512, Interval("integer", 1, 1_000_000),
            "training sentences whose tokens calibrate the layer-wise reconstruction", group="fine-tuning",
            metavar="N"),
    Setting("epochs", 3, _EPOCHS, "recovery epochs", group="fine-tuning"),
    Setting("lr", 2e-5, _RATE, "recovery learning rate", group="fine-tuning"),
    Setting("warmup_ratio", 0.1, _UNIT, "share of the fine-tuning steps that warm the learning rate up",
            group="fine-tuning"),
    Setting("weight_decay", 0.01, _UNIT, "AdamW weight decay of the fine-tuning", group="fine-tuning"),
    Setting("max_grad_norm", 1.0, Interval("real", 0.0, 1e6, closed="right"),
            "gradients are clipped to this norm while fine-tuning", group="fine-tuning"),
    Setting("dense_finetune", "auto", Options(DENSE_FINETUNE_MODES),
            "fine-tune the dense model first; auto: when its classifier head is untrained, does not fit the "
            "labels, or scores near chance on the evaluation split", group="fine-tuning"),
    Setting("untrained_dense", "fail", Options(UNTRAINED_DENSE),
            "with dense_finetune never, a dense model scoring near chance (or no better than the largest class) "
            "on the evaluation split: fail at the dense evaluation, or warn (flag it) and prune it anyway",
            group="fine-tuning"),
    Setting("dense_epochs", 3, _EPOCHS, "epochs of the dense fine-tuning", group="fine-tuning"),
    Setting("dense_lr", 5e-5, _RATE, "learning rate of the dense fine-tuning", group="fine-tuning"),
    Setting("recovery_loss", "distill", Options(RECOVERY_LOSSES),
            "distill: the dense model teaches the pruned one; ce: labels only", group="fine-tuning"),
    Setting("distill_alpha", 0.5, _UNIT, "weight of the labels in the distillation loss", group="fine-tuning"),
    Setting("distill_temperature", 4.0, Interval("real", 0.0, 100.0, closed="right"),
            "softmax temperature of the distillation loss", group="fine-tuning"),
    Setting("class_weight", "none", Options(CLASS_WEIGHTS),
            "balanced: recovery weighs each class's loss by n / (C * n_c) of the training split, so a rare class "
            "counts as much as a common one", group="fine-tuning"),
    Setting("early_stopping_patience", 0, Interval("integer", 0, 1000),
            "recovery scores the validation split before training and at every evaluation, keeps the best "
            "weights and stops after this many evaluations without gain; 0 turns it off (without an accuracy "
            "budget: the paper's fixed epochs on the whole training split, no validation)", group="fine-tuning"),
    Setting("eval_steps", 0, Interval("integer", 0, 10_000_000),
            "recovery scores the validation split every this many optimiser steps", "after every epoch",
            group="fine-tuning", metavar="N"),
    Setting("max_accuracy_drop", None, Interval("real", 0.0, 100.0),
            "keep the fewest heads whose validation score stays within P points of the dense model's "
            "(tries candidate head counts; off by default)", nullable=True, group="accuracy budget", metavar="P"),
    Setting("budget_objective", "heads", Options(BUDGET_OBJECTIVES),
            "what the budget minimises within P: heads (the fewest heads) or speed (the fastest model: a bisection "
            "over speed targets on target_runtime, heads and feed-forward neurons pruned, judged after "
            "reconstruction)", group="accuracy budget"),
    Setting("budget_metric", "accuracy", Options(BUDGET_METRICS),
            "the validation score the budget compares and recovery's early stopping watches",
            group="accuracy budget"),
    Setting("budget_search", "auto", Options(BUDGET_SEARCHES),
            "halving: every candidate fine-tuned (successive halving); judged: candidates scored after layer-wise "
            "reconstruction, the knee's head count fine-tuned first and only the few the scores point at after it; "
            "auto: judged when recovery reconstructs, else halving", group="accuracy budget"),
    Setting("budget_screen_epochs", 1.0, Interval("real", 0.0, 1000.0, closed="right"),
            "recovery epochs every candidate of a round gets before the more promising half gets more "
            "(successive halving's first rung; a judged search's probe length); each candidate keeps the full "
            "recovery's schedule",
            group="accuracy budget"),
    Setting("budget_strategies", BUDGET_STRATEGIES, SubsetOf(STRATEGIES),
            "the strategies whose choices are candidates at each head count", group="accuracy budget",
            metavar="S,S,...", parse=parse_name_list),
    Setting("budget_confidence", None, Interval("real", 0.5, 1.0, closed="neither"),
            "accept a candidate only when the upper bound of its drop at this confidence (paired bootstrap "
            "over the validation rows) is within P, e.g. 0.9", "the measured drop itself must be within P",
            nullable=True, group="accuracy budget"),
    Setting("budget_parallel", 1, Interval("integer", 1, 64),
            "head counts the budget's search tries per round (1: bisection; W: a k-ary search whose W x "
            "strategies candidates a pool of W workers runs side by side; the answer depends on this, never on "
            "the number of workers)", group="accuracy budget", metavar="W"),
    Setting("target_speedup", None, Interval("real", 1.0, 1000.0),
            "prune heads and feed-forward neurons until the model measures this many times faster than the dense one "
            "on target_runtime, e.g. 2.0 (the strategy picks which heads; no knee, no head count)",
            nullable=True, group="speed target", metavar="X"),
    Setting("target_flops", None, Interval("real", 0.0, 1.0, closed="right"),
            "prune heads and feed-forward neurons until the encoder keeps at most this fraction of its FLOPs, e.g. 0.5",
            nullable=True, group="speed target", metavar="F"),
    Setting("target_runtime", "pytorch", Options(TARGET_RUNTIMES),
            "the serving runtime a speed target is timed on: PyTorch fp32, onnxruntime fp32 or onnxruntime int8",
            group="speed target"),
    Setting("target_batch", 32, Interval("integer", 1, 4096), "the serving batch a speed target is timed at",
            group="speed target", metavar="B"),
    Setting("target_seq_len", "p95",
            Amount(Interval("integer", 1, 8192), ("p95",), "an integer between 1 and 8192 or 'p95'",
                   count=Interval("integer", 1, 8192)),
            "the serving length in tokens a target is costed at", "the 95th percentile of the training rows' lengths",
            group="speed target", metavar="T", parse=parse_length),
    Setting("device", "auto", Device(), "auto, cpu, cuda or cuda:N", surfaces=frozenset({"cli"})),
    Setting("latency_warmup", 3, Interval("integer", 0, 1000),
            "untimed passes per model and batch size before the latency is measured"),
    Setting("latency_repeats", 20, Interval("integer", 1, 10000),
            "timed passes per model and batch size when measuring the speed-up"),
    Setting("export", "onnx", Options(EXPORT_FORMATS), "also write onnx/, checked against PyTorch",
            group="deployment"),
    Setting("quantize", "none", Options(QUANTIZE_MODES), "int8 also writes onnx-int8/", group="deployment"),
    Setting("reported_degrees", REPORTED_DEGREES,
            TupleOf(_DEGREE, "a non-empty tuple of integers between 1 and 10"),
            "polynomial degrees whose knees are reported next to the chosen one", group="selection",
            metavar="D,D,...", parse=parse_int_list),
)

#: Setting name -> its default.
DEFAULTS: Mapping[str, Any] = MappingProxyType({s.name: s.default for s in SETTINGS})


def settings_for(surface: Surface) -> tuple[Setting, ...]:
    """The settings a user sets on ``surface`` (``"cli"``: ``cahp prune``; ``"api"``: a job's ``params``)."""
    return tuple(s for s in SETTINGS if surface in s.surfaces)
