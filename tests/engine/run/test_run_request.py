"""One request into the engine: ``run_pruning(RunRequest, RunHooks)`` and the functions that share its inputs.

A run's inputs, settings and limits travel as one frozen :class:`RunRequest`, what the caller hears back
as :class:`RunHooks`; no function on the way takes the long list again. Whole runs through this entry
are the golden run and the engine's run tests; here, what the request itself promises.
"""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest

from cahp_engine.config import PruningConfig
from cahp_engine.errors import PipelineError
from cahp_engine.run import RunHooks, RunIdentity, RunRequest, _records, _run, _steps, candidate_inputs, run_pruning


def test_a_request_is_frozen_names_its_inputs_twice_and_hides_its_token(tmp_path: Path) -> None:
    request = RunRequest(model_ref=str(tmp_path / "scratch" / "model"), dataset_ref="org/data", output_dir=tmp_path,
                         config=PruningConfig(), model_shown_as="upload://abc", hub_token="hf_secret",
                         identity=RunIdentity(base_model="my-model.tar.gz"))
    assert request.model_shown == "upload://abc" and request.dataset_shown == "org/data"
    assert "hf_secret" not in repr(request)
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.model_ref = "elsewhere"  # type: ignore[misc]


def test_candidate_inputs_refuse_a_run_without_a_budget_or_without_its_resume_store(tmp_path: Path) -> None:
    plain = RunRequest(model_ref="m", dataset_ref="d", output_dir=tmp_path, config=PruningConfig())
    with pytest.raises(PipelineError, match="max_accuracy_drop"):
        candidate_inputs(plain, RunHooks())
    budget = dataclasses.replace(plain, config=PruningConfig(max_accuracy_drop=1.0))
    with pytest.raises(PipelineError, match="hooks.resume_store must be the run's store, got None"):
        candidate_inputs(budget, RunHooks())


@pytest.mark.parametrize("function", [run_pruning, candidate_inputs, _run._run, _records.write_failure,
                                      _records.shared_records, _steps.load])
def test_the_entry_and_the_functions_that_share_its_inputs_take_at_most_five_parameters(function) -> None:
    assert len(inspect.signature(function).parameters) <= 5
