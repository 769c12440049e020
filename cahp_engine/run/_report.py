"""The typed record of one pruning run: what ``run_pruning`` returns and ``report.json`` holds.

:class:`RunReport` is a frozen dataclass of small parts; ``to_dict()`` gives exactly the content of
``report.json`` (the keys and their order are documented in ``docs/artifacts.md``) and
``RunReport.from_dict`` reads it back. The job service builds its result schema from
:class:`RunSummary`, and the command line prints its summary from the parts, so no caller reads the
report by key. Importable without torch or numpy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from cahp_engine.config import PruningConfig
from cahp_engine.export import ExportRecord
from cahp_engine.recovery import ClassificationMetrics, ParameterCounts, Reconstruction, SpeedComparison, TrainingResult
from cahp_engine.results import BudgetRecord, JsonRecord
from cahp_engine.run._identity import Identity, Recipe
from cahp_engine.run._quality import QualityRecord
from cahp_engine.run._target_record import TargetRecord
from cahp_engine.selection import ConsensusRecord, SamplingRecord, StabilityRecord

#: ``format_version`` of the reports this engine writes.
REPORT_FORMAT_VERSION = 1


@dataclass(frozen=True)
class RunSummary(JsonRecord):
    """The headline figures of a run.

    Attributes
    ----------
    k_star : int
        Number of clusters used: the knee, or ``heads_to_keep``.
    heads_total : int
        Attention heads of the dense model, L * H.
    heads_kept : int
        Heads left after pruning (representatives plus layer-safety heads for CAHP).
    retention : float
        ``heads_kept / heads_total``.
    dense_accuracy : float
        Accuracy of the dense model on the evaluation split (after dense fine-tuning, if it ran).
    pruned_accuracy : float
        Accuracy of the pruned model after recovery fine-tuning.
    speedup : float or None
        Dense p50 latency over pruned p50 latency at batch size 32 (else the first batch size timed).
    onnx_max_abs_diff : float or None
        The ONNX export's parity: the largest absolute logit difference from PyTorch (None without
        an export).
    onnx_speedup : float or None
        Dense PyTorch p50 over pruned onnxruntime p50, CPU, batch 32: the speed a deployer serving
        the ONNX model sees, against the model they started from.
    int8_accuracy, int8_speedup : float or None
        Accuracy of ``onnx-int8/`` on the evaluation split, and its speed-up as ``onnx_speedup``
        (None without ``quantize="int8"``).
    base_model, dataset : str or None
        The dense model and the dataset by name (``identity`` in the report).
    dense_macro_f1, pruned_macro_f1, onnx_accuracy, onnx_macro_f1, int8_macro_f1 : float or None
        Macro-F1 of each model on the evaluation split, and the ONNX graph's own accuracy.
    int8_max_abs_diff : float or None
        The int8 graph's largest absolute logit difference from the pruned PyTorch model (measured;
        int8 is not meant to be exact).
    speedup_low, speedup_high, onnx_speedup_low, onnx_speedup_high, int8_speedup_low, int8_speedup_high
        The 95 % interval of each speed-up over the interleaved timing rounds; a speed-up whose interval
        holds 1 is no measurable change.
    warnings : tuple of str
        Every warning of the run, the quality flags (``quality``) included.
    warning_codes : tuple of str
        A stable code for each warning, in the same order (``cahp_engine.run.WARNING_CODES``).
    """

    k_star: int
    heads_total: int
    heads_kept: int
    retention: float
    dense_accuracy: float
    pruned_accuracy: float
    speedup: float | None
    onnx_max_abs_diff: float | None = None
    onnx_speedup: float | None = None
    int8_accuracy: float | None = None
    int8_speedup: float | None = None
    base_model: str | None = None
    dataset: str | None = None
    dense_macro_f1: float | None = None
    pruned_macro_f1: float | None = None
    onnx_accuracy: float | None = None
    onnx_macro_f1: float | None = None
    int8_macro_f1: float | None = None
    int8_max_abs_diff: float | None = None
    speedup_low: float | None = None
    speedup_high: float | None = None
    onnx_speedup_low: float | None = None
    onnx_speedup_high: float | None = None
    int8_speedup_low: float | None = None
    int8_speedup_high: float | None = None
    warnings: tuple[str, ...] = ()
    warning_codes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelInfo(JsonRecord):
    """The dense model.

    Attributes
    ----------
    ref : str
        How the run names the model (a path, a hub id or a job's URI).
    revision : str or None
        Hub revision.
    family : str
        Adapter family, e.g. ``bert``.
    layers, heads_per_layer : int
        L and H.
    classifier_trained : bool
        Whether the checkpoint carried a trained classification head for the dataset's labels.
    """

    ref: str
    revision: str | None
    family: str
    layers: int
    heads_per_layer: int
    classifier_trained: bool


@dataclass(frozen=True)
class DatasetInfo(JsonRecord):
    """The dataset and the part of it that was used.

    Attributes
    ----------
    ref : str
        How the run names the dataset.
    source : str
        The resolved directory or hub id when the run was named by its location, else ``ref``.
    format : {"files", "save_to_disk", "hub"}
    splits_found : tuple of str
    train_split : str
    eval_split : str or None
        The split evaluated on.
    text_column, text_pair_column, label_column : str (pair: or None)
    config : str or None
        The dataset configuration read (``mnli`` of ``glue``), when it has several.
    label_names : tuple of str
        ``label_names[i]`` names class ``i``.
    train_rows, eval_rows : int
    """

    ref: str
    source: str
    format: str
    splits_found: tuple[str, ...]
    train_split: str
    eval_split: str | None
    text_column: str
    text_pair_column: str | None
    label_column: str
    config: str | None
    label_names: tuple[str, ...]
    train_rows: int
    eval_rows: int


@dataclass(frozen=True)
class Environment(JsonRecord):
    """Where the run ran.

    Attributes
    ----------
    python, platform : str
    cpu_count : int or None
    torch_threads : int
    cuda : str or None
        Name of CUDA device 0, when there is one.
    versions : dict of str to str or None
        Installed versions of the libraries that decide the results (None: not installed).
    """

    python: str
    platform: str
    cpu_count: int | None
    torch_threads: int
    cuda: str | None
    versions: dict[str, str | None]


@dataclass(frozen=True)
class DenseFinetuneRecord(JsonRecord):
    """Whether the dense model was fine-tuned before selection, and why.

    Attributes
    ----------
    mode : {"auto", "always", "never"}
    ran : bool
    reason : str
    training : TrainingResult or None
        The fine-tuning record, when it ran.
    """

    mode: str
    ran: bool
    reason: str
    training: TrainingResult | None


@dataclass(frozen=True)
class SelectionRecord(JsonRecord):
    """What head selection chose.

    Attributes
    ----------
    strategy : str
    k_star : int
    poly_degree : int
    knee_found : bool or None
        False when Kneedle found no knee at ``poly_degree``; None when ``heads_to_keep`` fixed k*.
    knees_by_degree : dict of int to int
    heads_total, heads_kept : int
    retention : float
    kept : dict of int to tuple of int
        Original indices of the kept heads, per layer (every layer present).
    layer_safety_added : tuple of (layer, head)
    resolution : int
    signature_samples, calibration_samples : int
    perplexity : float
        The t-SNE perplexity used (``config.perplexity``, or its default for N heads).
    signature_sampling, calibration_sampling : SamplingRecord or None
        How many samples each pass read, and why it stopped there.
    stability : StabilityRecord or None
        The same choice from the statistics of every shard but one; None when
        ``stability_shards`` is 0 or the shards were too thin.
    consensus : ConsensusRecord or None
        For a consensus strategy, how the K + 1 analyses it combined agreed and how often each head
        was kept; None for the other strategies and when there were no leave-one-out analyses.
    """

    strategy: str
    k_star: int
    poly_degree: int
    knee_found: bool | None
    knees_by_degree: dict[int, int]
    heads_total: int
    heads_kept: int
    retention: float
    kept: dict[int, tuple[int, ...]]
    layer_safety_added: tuple[tuple[int, int], ...]
    resolution: int
    signature_samples: int
    calibration_samples: int
    perplexity: float
    signature_sampling: SamplingRecord | None
    calibration_sampling: SamplingRecord | None
    stability: StabilityRecord | None
    consensus: ConsensusRecord | None = None


@dataclass(frozen=True)
class ValidationRecord(JsonRecord):
    """The validation split recovery judged on (early stopping, an accuracy budget); never the evaluation split.

    Attributes
    ----------
    split : str
        The dataset's validation split, or the training split's name when ``carved``.
    carved : bool
        True when the ``rows`` are a seeded stratified 10 % of the training split, left out of
        selection and of every fine-tuning (``dataset.train_rows`` counts what was left).
    rows : int
    metric : {"accuracy", "macro_f1"}
        What recovery's early stopping and the budget watch (``budget_metric``).
    dense : ClassificationMetrics
        The dense model on this split.
    """

    split: str
    carved: bool
    rows: int
    metric: str
    dense: ClassificationMetrics


@dataclass(frozen=True)
class RunMetrics(JsonRecord):
    """Scores on the evaluation split: dense, pruned before recovery, pruned after recovery."""

    dense: ClassificationMetrics
    pruned_before_recovery: ClassificationMetrics
    pruned: ClassificationMetrics


@dataclass(frozen=True)
class RunParameters(JsonRecord):
    """Parameter counts of the dense and the pruned model."""

    dense: ParameterCounts
    pruned: ParameterCounts


@dataclass(frozen=True)
class CheckpointRecord(JsonRecord):
    """The saved pruned model: ``path`` (relative to the output directory), ``format``, and the largest
    absolute logit difference between the model in memory and the checkpoint reloaded."""

    path: str
    format: str
    max_abs_logit_diff_after_reload: float


@dataclass(frozen=True)
class RunReport(JsonRecord):
    """Everything one pruning run did and measured; ``to_dict()`` is ``report.json``.

    Attributes
    ----------
    format_version : int
    created_at : str
        ISO 8601 time, UTC, to the second.
    summary : RunSummary
    model : ModelInfo
    dataset : DatasetInfo
    config : PruningConfig
    seed : int
    device : str
        The device the run computed on (``auto`` resolved).
    environment : Environment
    dense_finetune : DenseFinetuneRecord
    selection : SelectionRecord
    metrics : RunMetrics
    parameters : RunParameters
    speed : SpeedComparison
    recovery : TrainingResult
    checkpoint : CheckpointRecord
    export : ExportRecord
        The ONNX and int8 directories, their checks and their onnxruntime timing.
    timings_s : dict of str to float
        Wall seconds per stage, in the order the stages first ran.
    warnings : tuple of str
    wall_time_s : float
        The whole run.
    budget : BudgetRecord or None
        The accuracy-budget search, when ``config.max_accuracy_drop`` was set.
    validation : ValidationRecord or None
        The validation split recovery kept its best weights on (``recovery.validation`` is its curve),
        when ``early_stopping_patience`` or ``max_accuracy_drop`` was set.
    identity : Identity or None
        What the pruned model is: base model and dataset by name, classes, job, labels, cahp version.
    recipe : Recipe or None
        How it was made, in one place: head, dense fine-tuning, selection, recovery, seed, rows.
    quality : QualityRecord or None
        The quality checks of the dense, pruned and int8 models; their flags are also in ``warnings``.
    reconstruction : Reconstruction or None
        The layer-wise reconstruction (``config.recovery`` reconstruct or reconstruct+finetune).
    target : TargetRecord or None
        A speed or FLOPs target's allocation: heads and neurons kept per layer, predicted and measured speed-up.
    """

    format_version: int
    created_at: str
    summary: RunSummary
    model: ModelInfo
    dataset: DatasetInfo
    config: PruningConfig
    seed: int
    device: str
    environment: Environment
    dense_finetune: DenseFinetuneRecord
    selection: SelectionRecord
    metrics: RunMetrics
    parameters: RunParameters
    speed: SpeedComparison
    recovery: TrainingResult
    checkpoint: CheckpointRecord
    export: ExportRecord
    timings_s: dict[str, float]
    warnings: tuple[str, ...]
    wall_time_s: float
    budget: BudgetRecord | None = None
    validation: ValidationRecord | None = None
    identity: Identity | None = None
    recipe: Recipe | None = None
    quality: QualityRecord | None = None
    reconstruction: Reconstruction | None = None
    target: TargetRecord | None = None


@dataclass(frozen=True)
class RunError(JsonRecord):
    """Why a run failed: the engine error's stable ``code`` and its message."""

    code: str
    message: str


@dataclass(frozen=True)
class FailedRunMetrics(JsonRecord):
    """What a failed run measured before it stopped: the dense model on the evaluation split."""

    dense: ClassificationMetrics


@dataclass(frozen=True)
class FailedRunReport(JsonRecord):
    """``report.json`` of a run that missed its accuracy budget: the parts of :class:`RunReport` it reached.

    The one failed run that leaves files (the curve, the knee's head map, the budget plot and this
    report), so a caller can see every candidate the search tried and why none was kept. The fields it
    shares with :class:`RunReport` are the same records; ``status`` is always ``"failed"``.

    ``identity``, ``recipe`` and ``quality`` come last, after the fields such reports had before them:
    what the run was asked to make (``recipe.recovery`` is None: no recovered model was kept, and the
    selection is the knee's choice) and the quality checks of the dense model, the one model it
    measured on the evaluation split (their flags also open ``warnings``). They are None only in a
    report built without them.
    """

    format_version: int
    status: Literal["failed"]
    error: RunError
    created_at: str
    model: ModelInfo
    dataset: DatasetInfo
    config: PruningConfig
    seed: int
    device: str
    environment: Environment
    dense_finetune: DenseFinetuneRecord
    selection: SelectionRecord
    metrics: FailedRunMetrics
    budget: BudgetRecord | None
    timings_s: dict[str, float]
    warnings: tuple[str, ...]
    validation: ValidationRecord | None = None
    identity: Identity | None = None
    recipe: Recipe | None = None
    quality: QualityRecord | None = None
