"""The engine's exceptions, in one hierarchy.

::

    CahpError                      every error the engine raises on purpose
    ├── InvalidInputError          the caller must change something (CLI exit 2, HTTP 4xx)
    │   ├── ConfigError            a PruningConfig value is out of range
    │   ├── DatasetError           a dataset is missing, empty, mislabelled or lacks a column/split
    │   ├── ModelLoadError         a model path or hub id that cannot be loaded, or is not a classifier
    │   ├── UnsupportedModelError  a model family with no adapter in the adapter table
    │   ├── TargetUnreachableError a speed or FLOPs target beyond what the model reaches
    │                              (``cahp_engine.allocation``; the best reachable named)
    │   └── UntrainedModelError    ``dense_finetune: never`` on a dense model that scores near chance
    ├── JobCancelledError          a cancellation request was seen between two steps
    ├── AccuracyBudgetError        no candidate met ``max_accuracy_drop`` (the report is still written)
    └── PipelineError              a stage could not produce its result (a bug or an environment fault)
        └── ExportParityError      the exported ONNX graph does not reproduce the PyTorch model's logits

Each class carries a stable snake_case ``code`` that the service stores with a failed job.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cahp_engine.results import BudgetRecord


class CahpError(Exception):
    """Base class of every error the engine raises on purpose."""

    code = "internal_error"


class InvalidInputError(CahpError, ValueError):
    """Input the caller must change; the message says what to change."""

    code = "invalid_input"


class ConfigError(InvalidInputError):
    """A :class:`~cahp_engine.config.PruningConfig` value is out of range."""

    code = "invalid_config"


class DatasetError(InvalidInputError):
    """A dataset is missing, empty, mislabelled, or lacks a named column or split."""

    code = "invalid_dataset"


class ModelLoadError(InvalidInputError):
    """A model reference cannot be loaded, or does not name a sequence classifier."""

    code = "model_not_loadable"


class UnsupportedModelError(InvalidInputError):
    """The model's family has no adapter in :mod:`cahp_engine.models._adapters`."""

    code = "unsupported_model"


class UntrainedModelError(InvalidInputError):
    """``dense_finetune: never`` was asked for a dense model whose classifier scores near chance."""

    code = "untrained_model"


class JobCancelledError(CahpError):
    """Raised between two steps when the caller's cancellation check answers True."""

    code = "cancelled"


class PipelineError(CahpError):
    """A stage could not produce its result for a reason that is not the caller's input."""

    code = "pipeline_error"


class ExportParityError(PipelineError):
    """onnxruntime's logits differ from the PyTorch model's by more than the parity threshold.

    ``parity`` is the :class:`~cahp_engine.export._onnx.Parity` record that failed.
    """

    code = "export_parity_failed"

    def __init__(self, message: str, parity: object = None) -> None:
        super().__init__(message)
        self.parity = parity


class AccuracyBudgetError(CahpError):
    """No candidate head count kept the validation score within ``max_accuracy_drop`` of the dense model's.

    ``budget`` is the :class:`~cahp_engine.results.BudgetRecord` of the search (every candidate tried);
    the run still writes its report and plots (the one exception to "a failed run leaves nothing").
    """

    code = "accuracy_budget_not_met"

    def __init__(self, message: str, budget: BudgetRecord | None = None) -> None:
        super().__init__(message)
        self.budget = budget
