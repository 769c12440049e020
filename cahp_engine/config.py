"""One validated configuration object for a whole pruning run.

Every user-settable value of the engine lives in :class:`PruningConfig`. Each is declared once in
:data:`SETTINGS` (default, rule, help, and where a user sets it: ``cahp prune`` and the job API build
from the same records; the rules are :class:`Interval`, :class:`Options` and the named rules beside
them); ``__post_init__`` checks every field against its rule, with messages of the form
"`resolution` must be an integer >= 2, got 0", so a run fails before any model is loaded rather than
an hour into it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from cahp_engine._spec import (
    BUDGET_METRICS,
    BUDGET_OBJECTIVES,
    BUDGET_SEARCHES,
    BUDGET_STRATEGIES,
    CLASS_WEIGHTS,
    DEFAULTS,
    DENSE_FINETUNE_MODES,
    EXPORT_FORMATS,
    QUANTIZE_MODES,
    RECOVERY_LOSSES,
    RECOVERY_MODES,
    REPORTED_DEGREES,
    SETTINGS,
    TARGET_RUNTIMES,
    BudgetMetric,
    BudgetObjective,
    BudgetSearch,
    CalibrationAmount,
    ClassWeight,
    DenseFinetune,
    ExportFormat,
    Quantize,
    RecoveryLoss,
    RecoveryMode,
    SampleAmount,
    Setting,
    Strategy,
    TargetLength,
    TargetRuntime,
    UntrainedDense,
    settings_for,
)
from cahp_engine._strategy_names import CONSENSUS_STRATEGIES, STRATEGIES
from cahp_engine._validation import (
    Amount,
    Constraint,
    Device,
    Interval,
    OffOr,
    Options,
    SubsetOf,
    TupleOf,
    check,
    did_you_mean,
    parse_device,
)
from cahp_engine.errors import ConfigError

__all__ = [
    "BUDGET_METRICS", "BUDGET_OBJECTIVES", "BudgetObjective", "BUDGET_SEARCHES", "BudgetSearch", "BUDGET_STRATEGIES",
    "CLASS_WEIGHTS",
    "CONSENSUS_STRATEGIES", "ClassWeight", "STRATEGIES",
    "SubsetOf", "DEFAULTS",
    "DENSE_FINETUNE_MODES", "EXPORT_FORMATS", "QUANTIZE_MODES", "RECOVERY_LOSSES", "RECOVERY_MODES", "RecoveryMode",
    "REPORTED_DEGREES", "SETTINGS", "Amount", "BudgetMetric", "CalibrationAmount", "Constraint", "DenseFinetune",
    "Device", "ExportFormat", "Interval", "OffOr", "Options", "PruningConfig", "Quantize", "RecoveryLoss",
    "SampleAmount", "Setting", "Strategy", "TARGET_RUNTIMES", "TargetLength", "TargetRuntime",
    "TupleOf", "UntrainedDense", "did_you_mean", "parse_device", "settings_for",
]


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
        once the class differences of the signatures are mostly signal (noise share <= 0.2), or have
        stopped becoming more so (a plateau), with a floor per class and every row as the cap
        (:mod:`cahp_engine.selection._convergence`). A count, a fraction in (0, 1] (``1.0`` is every
        row) or ``"all"`` turns the rule off and is used exactly.
    strategy : {"cahp", "salience", "random", "coassociation", "stability-selection", "mean-distance",
                "cahp-layer-salience"}
        ``cahp`` is the paper's method; ``salience`` and ``random`` are baselines that keep the same
        number of heads (``heads_to_keep`` if given, otherwise the count CAHP would keep); the
        consensus strategies combine CAHP's analysis with its ``stability_shards`` leave-one-shard-out
        analyses into a steadier choice of k heads (plus layer safety), and make CAHP's own choice
        when there are none (:mod:`cahp_engine.selection._consensus`).
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
    recovery : {"finetune", "reconstruct", "reconstruct+finetune"}, default "finetune"
        ``finetune``: ``epochs`` of recovery fine-tuning from the pruned weights. ``reconstruct``: layer-wise
        reconstruction (:func:`cahp_engine.recovery.reconstruct`), no gradient training.
        ``reconstruct+finetune``: reconstruction, then the fine-tuning from its weights (on SST-5, level with
        ``finetune`` within the noise: ahead in the study's cells, level in whole jobs; docs/performance.md).
    reconstruction_rows : int >= 1, default 512
        Training sentences (drawn with the seed) whose tokens calibrate the reconstruction.
    epochs, lr, warmup_ratio, weight_decay, max_grad_norm
        Recovery fine-tuning recipe (paper Section IV-B.5: 3, 2e-5, 0.1, 0.01, 1.0).
    dense_finetune : {"auto", "always", "never"}
        Whether to fine-tune the dense model first (``auto``: when its classifier head is untrained
        or its label count does not match the dataset).
    untrained_dense : {"fail", "warn"}, default "fail"
        With ``dense_finetune: never``, a dense model that scores near chance (or no better than the
        largest class) on the evaluation split fails the run at the dense evaluation
        (:class:`~cahp_engine.errors.UntrainedModelError`, naming ``dense_finetune=always``); ``warn``
        flags it ``near_chance`` and prunes it anyway (a deliberately untrained model, a test's tiny one).
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
    class_weight : {"none", "balanced"}, default "none"
        ``balanced``: recovery weighs each class's loss by ``n / (C * n_c)`` of the training split
        (scikit-learn's rule), so a rare class is not given up for the common ones.
    early_stopping_patience : int >= 0, default 0
        Recovery watches a validation split (the dataset's own, else a seeded stratified 10 % carved
        from the training split and left out of selection and training): it scores it before
        training and at every evaluation, keeps the best weights (``budget_metric``; an evaluation
        that loses a class the dense model recalled ranks below any that keeps them all), stops
        after this many evaluations without gain and returns the best. 0 turns early stopping off;
        without an accuracy budget it also turns the validation off (the paper's fixed epochs on the
        whole training split, the last weights returned).
    eval_steps : int >= 0, default 0
        Evaluate every this many optimiser steps (0: after every epoch).
    max_accuracy_drop : float or None
        An accuracy budget in points (0-100): search the head counts for the smallest whose
        recovered validation score is within this many points of the dense model's, with no class
        lost (:mod:`cahp_engine.run._budget`). None (the default): one run at the knee.
    budget_objective : {"heads", "speed"}, default "heads"
        What the budget minimises within P. ``heads``: the fewest heads (the ladder of head counts).
        ``speed``: the fastest model, heads and feed-forward neurons pruned to a speed target on
        ``target_runtime``, the target found by a bisection between x1.1 and the reachable maximum on the
        candidates' validation scores after reconstruction (:mod:`cahp_engine.run._fastest`); needs
        ``recovery`` ``reconstruct`` or ``reconstruct+finetune`` and no ``target_speedup`` or ``target_flops``.
    budget_metric : {"accuracy", "macro_f1"}, default "accuracy"
        The validation score the budget compares and recovery's early stopping watches.
    budget_search : {"auto", "judged", "halving"}, default "auto"
        How the budget judges its candidates. ``halving``: every candidate is fine-tuned, successive
        halving (:mod:`cahp_engine.run._budget`). ``judged``: candidates are scored after layer-wise
        reconstruction, the knee's head count is fine-tuned first and then only the few the scores point at
        (:mod:`cahp_engine.run._judged`); the fine-tunings start from the weights ``recovery`` gives them.
        ``auto``: ``judged`` when ``recovery`` reconstructs, else ``halving``.
    budget_screen_epochs : float, default 1.0
        Successive halving's first rung: every candidate of a round trains this many epochs (of its
        full ``epochs`` schedule) before the more promising half trains on. In a judged search, the
        epochs a probe trains before it is judged (the winner's recovery then goes on to ``epochs``);
        in the fastest-target search with ``reconstruct+finetune``, the epochs a faster target's probe
        trains to measure what fine-tuning adds to its reconstructed score.
    budget_strategies : tuple of str, default ("cahp", "salience")
        The strategies whose choices are the budget's candidates at each head count.
    budget_confidence : float in (0.5, 1) or None
        Accept a candidate only when the one-sided upper bound of its validation drop at this
        confidence (paired bootstrap over the validation rows) is within P. None: the measured drop.
        Without ``max_accuracy_drop`` it has no effect, as the other ``budget_*`` settings.
    budget_parallel : int, default 1
        Head counts the search tries per round: 1 is bisection; W > 1 a k-ary search whose candidates
        a pool of workers runs side by side (:mod:`cahp_engine.run._budget`). The answer depends on
        this setting only, never on how many workers ran the candidates.
    target_speedup : float >= 1 or None
        A speed target: heads and feed-forward neurons are allocated per layer, by importance per unit of
        latency measured on ``target_runtime`` (a table fitted once per machine and cached), until the
        pruned model is predicted, then measured, this many times faster than the dense one at
        ``target_batch`` x ``target_seq_len`` (:func:`cahp_engine.allocation.prune_to_target`); the
        strategy chooses which heads within each layer's count. Excludes ``heads_to_keep``,
        ``max_accuracy_drop`` (``budget_objective`` ``speed`` searches the target instead) and ``target_flops``.
    target_flops : float in (0, 1] or None
        A FLOPs target: the same allocation by importance per FLOP, keeping at most this fraction of the
        encoder's FLOPs.
    target_runtime : {"pytorch", "ort-fp32", "ort-int8"}, default "pytorch"
        The serving runtime a speed target's latency table and measured speed-up are timed on.
    target_batch : int, default 32
        The serving batch a target is costed and timed at.
    target_seq_len : int or "p95", default "p95"
        The serving length in tokens; ``"p95"``: the 95th percentile of the calibration rows' lengths.
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

    poly_degree: int = DEFAULTS["poly_degree"]
    heads_to_keep: int | None = DEFAULTS["heads_to_keep"]
    resolution: int | None = DEFAULTS["resolution"]
    calibration_fraction: CalibrationAmount = DEFAULTS["calibration_fraction"]
    signature_samples: SampleAmount = DEFAULTS["signature_samples"]
    strategy: Strategy = DEFAULTS["strategy"]
    seed: int = DEFAULTS["seed"]
    batch_size: int = DEFAULTS["batch_size"]
    max_length: int = DEFAULTS["max_length"]
    perplexity: float | None = DEFAULTS["perplexity"]
    var_floor: float = DEFAULTS["var_floor"]
    stability_shards: int = DEFAULTS["stability_shards"]
    recovery: RecoveryMode = DEFAULTS["recovery"]
    reconstruction_rows: int = DEFAULTS["reconstruction_rows"]
    epochs: float = DEFAULTS["epochs"]
    lr: float = DEFAULTS["lr"]
    warmup_ratio: float = DEFAULTS["warmup_ratio"]
    weight_decay: float = DEFAULTS["weight_decay"]
    max_grad_norm: float = DEFAULTS["max_grad_norm"]
    dense_finetune: DenseFinetune = DEFAULTS["dense_finetune"]
    untrained_dense: UntrainedDense = DEFAULTS["untrained_dense"]
    dense_epochs: float = DEFAULTS["dense_epochs"]
    dense_lr: float = DEFAULTS["dense_lr"]
    recovery_loss: RecoveryLoss = DEFAULTS["recovery_loss"]
    distill_alpha: float = DEFAULTS["distill_alpha"]
    distill_temperature: float = DEFAULTS["distill_temperature"]
    class_weight: ClassWeight = DEFAULTS["class_weight"]
    early_stopping_patience: int = DEFAULTS["early_stopping_patience"]
    eval_steps: int = DEFAULTS["eval_steps"]
    max_accuracy_drop: float | None = DEFAULTS["max_accuracy_drop"]
    budget_objective: BudgetObjective = DEFAULTS["budget_objective"]
    budget_metric: BudgetMetric = DEFAULTS["budget_metric"]
    budget_search: BudgetSearch = DEFAULTS["budget_search"]
    budget_screen_epochs: float = DEFAULTS["budget_screen_epochs"]
    budget_strategies: tuple[Strategy, ...] = DEFAULTS["budget_strategies"]
    budget_confidence: float | None = DEFAULTS["budget_confidence"]
    budget_parallel: int = DEFAULTS["budget_parallel"]
    target_speedup: float | None = DEFAULTS["target_speedup"]
    target_flops: float | None = DEFAULTS["target_flops"]
    target_runtime: TargetRuntime = DEFAULTS["target_runtime"]
    target_batch: int = DEFAULTS["target_batch"]
    target_seq_len: TargetLength = DEFAULTS["target_seq_len"]
    device: str = DEFAULTS["device"]
    latency_warmup: int = DEFAULTS["latency_warmup"]
    latency_repeats: int = DEFAULTS["latency_repeats"]
    export: ExportFormat = DEFAULTS["export"]
    quantize: Quantize = DEFAULTS["quantize"]
    reported_degrees: tuple[int, ...] = DEFAULTS["reported_degrees"]

    def __post_init__(self) -> None:
        for setting in SETTINGS:
            check(setting.name, getattr(self, setting.name), setting.rule, allow_none=setting.nullable)
        if self.max_accuracy_drop is not None and self.heads_to_keep is not None:
            raise ConfigError("`max_accuracy_drop` searches for the head count and `heads_to_keep` fixes it; "
                              "set one of them")
        if self.budget_search == "halving" and self.recovery == "reconstruct":
            raise ConfigError("`budget_search` 'halving' fine-tunes every candidate and `recovery` 'reconstruct' "
                              "fine-tunes none; set `budget_search` to 'judged' (or 'auto'), or `recovery` to "
                              "'finetune' or 'reconstruct+finetune'")
        _check_target(self)
        if self.quantize != "none" and self.export == "none":
            raise ConfigError(f"`quantize` {self.quantize!r} quantizes the ONNX export; set `export` to 'onnx' or "
                              "`quantize` to 'none'")

    def replace(self, **changes: Any) -> PruningConfig:
        """Return a copy with ``changes`` applied and validated."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready mapping of every field."""
        out = dataclasses.asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> PruningConfig:
        """Build from a mapping, rejecting unknown keys with the list of known ones."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            hint = did_you_mean(unknown[0], known) if len(unknown) == 1 else ""
            raise ConfigError(f"unknown setting(s) {', '.join(unknown)}{hint}; known settings: "
                              f"{', '.join(sorted(known))}")
        values = dict(values)
        for name in ("reported_degrees", "budget_strategies"):
            if isinstance(values.get(name), list):
                values[name] = tuple(values[name])
        return cls(**values)


def _check_target(config: PruningConfig) -> None:
    """The rules a speed or FLOPs target sets on the other settings (its own range is in its rule)."""
    if config.budget_objective == "speed":
        if config.max_accuracy_drop is None:
            raise ConfigError("`budget_objective` 'speed' looks for the fastest model within an accuracy budget; set "
                              "`max_accuracy_drop` too (or `target_speedup` alone for a speed you name)")
        if config.target_speedup is not None or config.target_flops is not None:
            named = "`target_speedup`" if config.target_speedup is not None else "`target_flops`"
            raise ConfigError(f"`budget_objective` 'speed' searches for the speed target and {named} fixes it; "
                              f"leave {named} unset (or set `budget_objective` to 'heads' and drop "
                              "`max_accuracy_drop`)")
        if config.recovery == "finetune":
            raise ConfigError("`budget_objective` 'speed' judges its candidates after layer-wise reconstruction; "
                              "set `recovery` to 'reconstruct' or 'reconstruct+finetune'")
    if config.target_speedup is not None and config.target_flops is not None:
        raise ConfigError("`target_speedup` and `target_flops` each set the size of the model; set one of them")
    named = "`target_speedup`" if config.target_speedup is not None else "`target_flops`"
    if config.target_speedup is None and config.target_flops is None:
        return
    if config.heads_to_keep is not None:
        raise ConfigError(f"{named} decides how many heads each layer keeps and `heads_to_keep` fixes the count; "
                          "set one of them")
    if config.max_accuracy_drop is not None:
        raise ConfigError(f"{named} fixes the model's size and `max_accuracy_drop` searches for it; for the fastest "
                          f"model within the budget leave {named} unset and set `budget_objective` to 'speed'")
