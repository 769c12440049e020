"""One validated configuration object for a whole pruning run.

Every user-settable value of the engine lives in :class:`PruningConfig`. It is checked once, in
``__post_init__``, with messages of the form "`resolution` must be an integer >= 2, got 0", so a run
fails before any model is loaded rather than an hour into it.
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from cahp_engine._validation import Interval, Options, check, is_int, is_real, parse_device
from cahp_engine.errors import ConfigError
from cahp_engine.selection import STRATEGIES

if TYPE_CHECKING:
    Strategy = str
else:
    #: The registered strategy names (:data:`cahp_engine.selection.REGISTRY`), as a type: the job
    #: API's generated schema lists them.
    Strategy = Literal[STRATEGIES]
DenseFinetune = Literal["auto", "always", "never"]
#: ``signature_samples``: a count, a fraction of the training split (1.0 is every row), ``"all"``, or
#: ``"auto"`` (the stopping rule of :mod:`cahp_engine.selection._convergence` decides).
SampleAmount = int | float | Literal["auto", "all"]
#: ``calibration_fraction``: a fraction of the training split, or ``"auto"`` (the stopping rule decides).
CalibrationAmount = float | Literal["auto"]

DENSE_FINETUNE_MODES: tuple[str, ...] = ("auto", "always", "never")
ExportFormat = Literal["onnx", "none"]
Quantize = Literal["none", "int8"]
RecoveryLoss = Literal["ce", "distill"]
BudgetMetric = Literal["accuracy", "macro_f1"]
RECOVERY_LOSSES: tuple[str, ...] = ("ce", "distill")
BUDGET_METRICS: tuple[str, ...] = ("accuracy", "macro_f1")
EXPORT_FORMATS: tuple[str, ...] = ("onnx", "none")
QUANTIZE_MODES: tuple[str, ...] = ("none", "int8")
#: Polynomial degrees reported in ``knees_by_degree`` (the paper's sweep, Section IV-B.2).
REPORTED_DEGREES: tuple[int, ...] = (2, 3, 4, 5, 6)

@dataclass(frozen=True)
class PruningConfig:
    """Settings of one CAHP run: head selection, recovery fine-tuning and evaluation.

    Parameters
    ----------
    poly_degree : int, default 2
        Degree of the polynomial Kneedle fits to the MSS curve (paper Section IV-B.2). Higher degrees
        follow the curve more closely and usually pick a smaller k*.
    heads_to_keep : int or None
        Keep exactly this many clusters (one representative each) instead of locating the knee.
    resolution : int or None
        Side B of the resized attention maps. ``None`` takes the 70th percentile of the tokenised
        lengths of the training split (paper Section IV-B.1).
    calibration_fraction : float or "auto", default "auto"
        Share of the training split, drawn with ``seed``, over which head salience is averaged.
        ``"auto"``: the calibration pass stops once the salience ranking is stable
        (:mod:`cahp_engine.selection._convergence`), at the latest after every row. A number in (0, 1] (the
        paper: 0.25) turns the rule off and is used exactly.
    signature_samples : int, float, "all" or "auto", default "auto"
        Training samples profiled for signatures. ``"auto"``: a seeded stratified stream that stops
        once the class differences of the signatures are mostly signal (noise share <= 0.2), with a
        floor per class and every row as the cap (:mod:`cahp_engine.selection._convergence`). A count, a
        fraction in (0, 1] (``1.0`` is every row) or ``"all"`` turns the rule off and is used exactly.
    strategy : {"cahp", "salience", "random"}
        ``cahp`` is the paper's method; the others are baselines that keep the same number of heads
        (``heads_to_keep`` if given, otherwise the count CAHP would keep).
    seed : int
        Seeds every random choice: sample draws, t-SNE, FasterPAM, baselines and fine-tuning.
    batch_size : int, default 32
        Batch size of every pass: signatures, salience, fine-tuning and evaluation (paper: 32).
    max_length : int, default 512
        Longer inputs are truncated to this many tokens.
    perplexity : float or None
        t-SNE perplexity; ``None`` takes ``min(10, (N - 1) / 3)`` for N heads (10: the public
        implementation's value).
    var_floor : float, default 1e-6
        Floor on class variances before the Bhattacharyya distance, so a pixel with zero variance in
        both classes gives a finite distance (1e-6: the public implementation's value).
    stability_shards : int, default 5
        K: the signature and calibration samples are accumulated in K disjoint stratified shards,
        and the cheap stages are rerun leaving one shard out each time to measure how stable the
        selection is (``selection.stability`` of the report). 0 turns the measure off.
    epochs, lr, warmup_ratio, weight_decay, max_grad_norm
        Recovery fine-tuning recipe (paper Section IV-B.5: 3, 2e-5, 0.1, 0.01, 1.0).
    dense_finetune : {"auto", "always", "never"}
        Whether to fine-tune the dense model first (``auto``: when its classifier head is untrained
        or its label count does not match the dataset).
    dense_epochs, dense_lr
        Recipe of that dense fine-tuning; the other values are shared with recovery.
    recovery_loss : {"ce", "distill"}, default "distill"
        ``distill``: the dense model the run started from (after dense fine-tuning when that ran)
        teaches the pruned one (:mod:`cahp_engine.recovery._distillation`); its logits over the training split are
        computed once. ``ce``: cross-entropy with the labels alone (the paper's recovery).
    distill_alpha : float in [0, 1], default 0.5
        Weight of the labels' cross-entropy in the distillation loss (1 is plain cross-entropy).
    distill_temperature : float > 0, default 4.0
        Temperature of the distillation loss's softmaxes.
    max_accuracy_drop : float or None
        An accuracy budget in points (0-100): try candidate head counts from the smallest and keep
        the smallest whose validation score after recovery is within this many points of the dense
        model's (:mod:`cahp_engine.run._budget`). None (the default): one run at the knee.
    budget_metric : {"accuracy", "macro_f1"}, default "accuracy"
        The validation score the budget compares.
    budget_screen_epochs : float, default 1.0
        Recovery epochs of each candidate while searching; the chosen one then gets ``epochs``.
    device : str
        ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
    export : {"onnx", "none"}, default "onnx"
        Also write the pruned model as an ONNX directory (``onnx/``) that onnxruntime loads without
        cahp, checked against PyTorch (max absolute logit difference at most 1e-4, else the run
        fails with ``export_parity_failed``), and time it against PyTorch.
    quantize : {"none", "int8"}, default "none"
        ``int8`` also writes ``onnx-int8/``: the ONNX model with dynamic int8 weights, with its
        accuracy on the evaluation split and its latency. Needs ``export="onnx"``.
    latency_warmup, latency_repeats : int
        Untimed and timed passes per model and batch size when measuring the speed-up.
    reported_degrees : tuple of int
        Polynomial degrees whose knees are reported next to the chosen one (default 2..6).
    """

    poly_degree: int = 2
    heads_to_keep: int | None = None
    resolution: int | None = None
    calibration_fraction: CalibrationAmount = "auto"
    signature_samples: SampleAmount = "auto"
    strategy: Strategy = "cahp"
    seed: int = 42
    batch_size: int = 32
    max_length: int = 512
    perplexity: float | None = None
    var_floor: float = 1e-6
    stability_shards: int = 5
    epochs: float = 3
    lr: float = 2e-5
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    dense_finetune: DenseFinetune = "auto"
    dense_epochs: float = 3
    dense_lr: float = 5e-5
    recovery_loss: RecoveryLoss = "distill"
    distill_alpha: float = 0.5
    distill_temperature: float = 4.0
    max_accuracy_drop: float | None = None
    budget_metric: BudgetMetric = "accuracy"
    budget_screen_epochs: float = 1.0
    device: str = "auto"
    latency_warmup: int = 3
    latency_repeats: int = 20
    export: ExportFormat = "onnx"
    quantize: Quantize = "none"
    reported_degrees: tuple[int, ...] = field(default=REPORTED_DEGREES)

    def __post_init__(self) -> None:
        check("poly_degree", self.poly_degree, Interval("integer", 1, 10))
        check("heads_to_keep", self.heads_to_keep, Interval("integer", 1, None, closed="left"), allow_none=True)
        check("resolution", self.resolution, Interval("integer", 2, 512), allow_none=True)
        if self.calibration_fraction != "auto":
            if not is_real(self.calibration_fraction):
                raise ConfigError(f"`calibration_fraction` must be a number in (0.0, 1.0] or 'auto', "
                                  f"got {self.calibration_fraction!r}")
            check("calibration_fraction", self.calibration_fraction, Interval("real", 0.0, 1.0, closed="right"))
        s = self.signature_samples
        if is_int(s):
            check("signature_samples", s, Interval("integer", 2, None, closed="left"))
        elif isinstance(s, numbers.Real) and not isinstance(s, bool):
            check("signature_samples", s, Interval("real", 0.0, 1.0, closed="right"))
        elif s not in ("auto", "all"):
            raise ConfigError(
                "`signature_samples` must be an integer count >= 2, a fraction in (0, 1], 'all' or 'auto', "
                f"got {s!r}"
            )
        check("strategy", self.strategy, Options(STRATEGIES))
        check("seed", self.seed, Interval("integer", 0, 2**32 - 1))
        check("batch_size", self.batch_size, Interval("integer", 1, 4096))
        check("max_length", self.max_length, Interval("integer", 2, 8192))
        check("perplexity", self.perplexity, Interval("real", 0.0, 1e6, closed="neither"), allow_none=True)
        check("var_floor", self.var_floor, Interval("real", 0.0, 1.0, closed="neither"))
        if not (is_int(self.stability_shards) and (self.stability_shards == 0 or 2 <= self.stability_shards <= 20)):
            raise ConfigError(
                f"`stability_shards` must be 0 (off) or an integer between 2 and 20, got {self.stability_shards!r}"
            )
        for name in ("epochs", "dense_epochs"):
            check(name, getattr(self, name), Interval("real", 0.0, 1000.0))
        for name in ("lr", "dense_lr"):
            check(name, getattr(self, name), Interval("real", 0.0, 1.0, closed="right"))
        check("warmup_ratio", self.warmup_ratio, Interval("real", 0.0, 1.0))
        check("weight_decay", self.weight_decay, Interval("real", 0.0, 1.0))
        check("max_grad_norm", self.max_grad_norm, Interval("real", 0.0, 1e6, closed="right"))
        check("dense_finetune", self.dense_finetune, Options(DENSE_FINETUNE_MODES))
        check("recovery_loss", self.recovery_loss, Options(RECOVERY_LOSSES))
        check("distill_alpha", self.distill_alpha, Interval("real", 0.0, 1.0))
        check("distill_temperature", self.distill_temperature, Interval("real", 0.0, 100.0, closed="right"))
        check("max_accuracy_drop", self.max_accuracy_drop, Interval("real", 0.0, 100.0), allow_none=True)
        check("budget_metric", self.budget_metric, Options(BUDGET_METRICS))
        check("budget_screen_epochs", self.budget_screen_epochs, Interval("real", 0.0, 1000.0, closed="right"))
        if self.max_accuracy_drop is not None and self.heads_to_keep is not None:
            raise ConfigError("`max_accuracy_drop` searches for the head count and `heads_to_keep` fixes it; "
                              "set one of them")
        check("latency_warmup", self.latency_warmup, Interval("integer", 0, 1000))
        check("latency_repeats", self.latency_repeats, Interval("integer", 1, 10000))
        check("export", self.export, Options(EXPORT_FORMATS))
        check("quantize", self.quantize, Options(QUANTIZE_MODES))
        if self.quantize != "none" and self.export == "none":
            raise ConfigError(f"`quantize` {self.quantize!r} quantizes the ONNX export; set `export` to 'onnx' or "
                              "`quantize` to 'none'")
        parse_device(self.device)
        degree = Interval("integer", 1, 10)
        if not self.reported_degrees or not all(d in degree for d in self.reported_degrees):
            raise ConfigError(
                f"`reported_degrees` must be a non-empty tuple of integers between 1 and 10, "
                f"got {self.reported_degrees!r}"
            )

    def replace(self, **changes: Any) -> PruningConfig:
        """Return a copy with ``changes`` applied and validated."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready mapping of every field."""
        out = dataclasses.asdict(self)
        out["reported_degrees"] = list(self.reported_degrees)
        return out

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> PruningConfig:
        """Build from a mapping, rejecting unknown keys with the list of known ones."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown setting(s) {', '.join(unknown)}; known settings: {', '.join(sorted(known))}")
        values = dict(values)
        if "reported_degrees" in values and isinstance(values["reported_degrees"], list):
            values["reported_degrees"] = tuple(values["reported_degrees"])
        return cls(**values)

