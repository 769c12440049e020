"""An accuracy budget's shared inputs, built again in another process: where a pool's worker starts.

A worker that runs candidates of someone else's run (:mod:`worker.candidates`) needs the
:class:`~cahp_engine.run._candidates.SearchInputs` that run searches with. :func:`candidate_inputs`
builds them from the run's own inputs and checkpoints, as :func:`~cahp_engine.run.run_pruning` does
up to its search: it loads the model and the data (the same carved validation rows, by the seed),
takes the dense fine-tuned weights from the run's checkpoints (the run saves them before it searches),
and computes the dense model's validation predictions and, when recovery distils, its logits over the
training rows. These are forward passes in eval mode, so on the same kind of device they equal the
run's own; nothing is written to the run's checkpoints.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path

from cahp_engine._torch import resolve_device
from cahp_engine.config import PruningConfig
from cahp_engine.data import DEFAULT_MAX_ROWS, DatasetOptions
from cahp_engine.errors import PipelineError
from cahp_engine.models import DEFAULT_MAX_MODEL_PARAMS
from cahp_engine.progress import Monitor
from cahp_engine.run import _steps as steps
from cahp_engine.run._candidates import SearchInputs
from cahp_engine.run._checkpoints import Checkpointer, CheckpointStore
from cahp_engine.run._live import LiveLog

__all__ = ["candidate_inputs"]


class _ReadOnly:
    """A :class:`CheckpointStore` that restores what ``store`` holds and keeps nothing new."""

    def __init__(self, store: CheckpointStore) -> None:
        self._store = store

    def save(self, stage: str, directory: Path) -> None:
        return None

    def restore(self) -> Mapping[str, Path]:
        return self._store.restore()

    def discard(self, stage: str) -> None:
        return None


def candidate_inputs(
    model_ref: str,
    dataset_ref: str,
    config: PruningConfig,
    *,
    checkpoints: CheckpointStore,
    dataset_options: DatasetOptions | None = None,
    max_dataset_rows: int | None = DEFAULT_MAX_ROWS,
    max_model_params: int = DEFAULT_MAX_MODEL_PARAMS,
    revision: str | None = None,
    hub_token: str | None = None,
    cache_dir: str | None = None,
    model_name: str | None = None,
    dataset_name: str | None = None,
    should_cancel: Callable[[], bool] | None = None,
    log: Callable[[str], None] | None = None,
) -> SearchInputs:
    """The :class:`SearchInputs` of the run of ``model_ref`` on ``dataset_ref`` with ``config``.

    Parameters are those of :func:`~cahp_engine.run.run_pruning`; ``checkpoints`` is the run's store
    (read only). ``progress`` of the result is unset: the caller reports its own.

    Raises
    ------
    PipelineError
        When ``config`` has no accuracy budget, or the run fine-tuned its dense model and its
        checkpoints do not hold the result (it saves it before its search starts).
    """
    if config.max_accuracy_drop is None:
        raise PipelineError("candidate inputs exist only for a run with an accuracy budget (max_accuracy_drop)")
    say = log or (lambda _line: None)
    run = steps.RunContext(config=config, device=resolve_device(config.device),
                           monitor=Monitor(lambda _stage, _fraction: None, should_cancel), say=say,
                           overall=lambda _stage, _fraction: None, should_cancel=should_cancel)
    saved = Checkpointer(_ReadOnly(checkpoints), config, say, live=LiveLog(say, interval_s=math.inf))
    inputs = steps.load(run, model_ref=model_ref, dataset_ref=dataset_ref, options=dataset_options or DatasetOptions(),
                        revision=revision, hub_token=hub_token, cache_dir=cache_dir,
                        model_name=model_name or model_ref, dataset_name=dataset_name or dataset_ref,
                        max_rows=max_dataset_rows, max_params=max_model_params)
    model = inputs.loaded.model
    if "dense" not in saved.saved and steps.dense_finetune_runs(config, inputs.loaded.classifier_trained):
        raise PipelineError("the run's dense fine-tuned model is not among its checkpoints yet")
    saved.dense_finetune(run, model=model, inputs=inputs, classifier_trained=inputs.loaded.classifier_trained)
    assert inputs.validation is not None  # a budget always has a validation split (steps.load)
    dense_validation, predictions = steps.evaluate_validation(run, model=model, validation=inputs.validation)
    teacher = steps.teacher(run, model=model, train=inputs.train)
    return steps.search_inputs(run, inputs=inputs, model=model, teacher=teacher, dense_validation=dense_validation,
                               dense_predictions=predictions)
