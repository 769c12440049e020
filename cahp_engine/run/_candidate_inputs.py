"""An accuracy budget's shared inputs, built again in another process: where a pool's worker starts.

A worker that runs candidates of someone else's run (:mod:`worker.candidates`) needs the
:class:`~cahp_engine.run._candidates.SearchInputs` that run searches with. :func:`candidate_inputs`
builds them from the run's own :class:`~cahp_engine.run.RunRequest` and resume store, as
:func:`~cahp_engine.run.run_pruning` does up to its search: it loads the model and the data (the same
carved validation rows, by the seed), takes the dense fine-tuned weights from the run's resume store
(the run saves them before it searches), and computes the dense model's validation predictions and,
when recovery distils, its logits over the training rows. These are forward passes in eval mode, so on
the same kind of device they equal the run's own; nothing is written to the run's resume store.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

from cahp_engine._torch import resolve_device
from cahp_engine.errors import PipelineError
from cahp_engine.progress import Monitor
from cahp_engine.run import _steps as steps
from cahp_engine.run._candidates import SearchInputs
from cahp_engine.run._hooks import RunHooks
from cahp_engine.run._live import LiveLog
from cahp_engine.run._request import RunRequest
from cahp_engine.run._resume import Resumer, ResumeStore

__all__ = ["candidate_inputs"]


class _ReadOnly:
    """A :class:`ResumeStore` that restores what ``store`` holds and keeps nothing new."""

    def __init__(self, store: ResumeStore) -> None:
        self._store = store

    def save(self, stage: str, directory: Path) -> None:
        return None

    def restore(self) -> Mapping[str, Path]:
        return self._store.restore()

    def discard(self, stage: str) -> None:
        return None


def candidate_inputs(request: RunRequest, hooks: RunHooks) -> SearchInputs:
    """The :class:`SearchInputs` of the run ``request`` describes.

    Parameters
    ----------
    request : RunRequest
        The run's own request: its inputs, settings and limits are read; its output directory is not
        touched.
    hooks : RunHooks
        ``resume_store`` is the run's store (required; read only); ``should_cancel`` and ``log`` are
        used, the rest ignored. ``progress`` of the result is unset: the caller reports its own.

    Raises
    ------
    PipelineError
        When ``request.config`` has no accuracy budget, ``hooks.resume_store`` is None, or the run
        fine-tuned its dense model and its resume store does not hold the result (it saves it before its
        search starts).
    """
    config = request.config
    if config.max_accuracy_drop is None:
        raise PipelineError("candidate inputs exist only for a run with an accuracy budget (max_accuracy_drop)")
    if hooks.resume_store is None:
        raise PipelineError("candidate inputs are rebuilt from the run's resume state: hooks.resume_store must be "
                            "the run's store, got None")
    say = hooks.say
    run = steps.RunContext(config=config, device=resolve_device(config.device),
                           monitor=Monitor(lambda _stage, _fraction: None, hooks.should_cancel), say=say,
                           overall=lambda _stage, _fraction: None, should_cancel=hooks.should_cancel)
    saved = Resumer(_ReadOnly(hooks.resume_store), config, say, live=LiveLog(say, interval_s=math.inf))
    inputs = steps.load(run, request)
    model = inputs.loaded.model
    if "dense" not in saved.saved and steps.dense_finetune_runs(config, inputs.loaded.classifier_trained):
        raise PipelineError("the run's dense fine-tuned model is not in its resume store yet")
    saved.dense_finetune(run, model=model, inputs=inputs, classifier_trained=inputs.loaded.classifier_trained)
    assert inputs.validation is not None  # a budget always has a validation split (steps.load)
    dense_validation, predictions = steps.evaluate_validation(run, model=model, validation=inputs.validation)
    teacher = steps.teacher(run, model=model, train=inputs.train)
    return steps.search_inputs(run, inputs=inputs, teacher=teacher, dense_validation=dense_validation,
                               dense_predictions=predictions)
