"""A claimed job read once into typed records, and the engine's request built from them.

Each input keeps two names in two fields: the reference the job was submitted with (what the report
and the log show, never a worker's scratch path) and its readable name (what the identity and the cards
show). The request carries the worker's limits and hub access, and keeps the hub token out of its repr.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import SecretStr

from app.core.db import Job
from cahp_engine.config import PruningConfig
from cahp_engine.errors import DatasetError
from tests.support.helpers import service_settings
from worker.claims import JobDefinition, run_request


@dataclass(frozen=True)
class _Fetched:
    model_ref: str
    dataset_ref: str


def _row(**overrides: object) -> Job:
    fields: dict[str, object] = {
        "id": "job-1", "owner_id": "key-1", "model_uri": "upload://u-model", "model_revision": None,
        "dataset": {"uri": "hf://datasets/org/reviews", "text_column": "review", "label_column": "stars"},
        "params": {"seed": 7}, "name": "reviews-small", "labels": {"git/commit": "abc123"},
        "model_name": "my-bert.tar.gz", "dataset_name": "org/reviews", "register": {"model_name": "reviews"},
    }
    return Job(**{**fields, **overrides})


def test_the_request_shows_the_jobs_uris_and_names_the_inputs_by_their_readable_names(tmp_path: Path) -> None:
    job = JobDefinition.of(_row())
    settings = service_settings(tmp_path).model_copy(update={"hub_token": SecretStr("hf_not_for_logs")})
    fetched = _Fetched(model_ref=str(tmp_path / "scratch" / "model"), dataset_ref="org/reviews")
    request = run_request(job, PruningConfig(seed=7), fetched, tmp_path / "out", settings)

    assert (request.model_ref, request.dataset_ref) == (fetched.model_ref, "org/reviews")
    assert (request.model_shown, request.dataset_shown) == ("upload://u-model", "hf://datasets/org/reviews")
    identity = request.identity
    assert identity is not None and identity.base_model == "my-bert.tar.gz" and identity.base_model_hub_id is None
    assert (identity.dataset, identity.dataset_hub_id) == ("org/reviews", "org/reviews")
    assert (identity.name, identity.job_id, identity.labels) == ("reviews-small", "job-1", {"git/commit": "abc123"})
    assert (request.dataset_options.text_column, request.dataset_options.label_column) == ("review", "stars")
    assert (request.max_dataset_rows, request.max_model_params) == (settings.max_dataset_rows,
                                                                   settings.model_params_limit)
    assert request.hub_token == "hf_not_for_logs" and "hf_not_for_logs" not in repr(request)
    assert job.register is not None and job.register.model_name == "reviews"


def test_a_hub_model_is_named_by_its_hub_id_and_a_local_run_by_its_reference(tmp_path: Path) -> None:
    job = JobDefinition.of(_row(model_uri="hf://org/bert-base", model_revision="main", register=None))
    request = run_request(job, PruningConfig(), _Fetched("org/bert-base", "org/reviews"), tmp_path / "out",
                          service_settings(tmp_path))
    assert request.identity is not None and request.identity.base_model_hub_id == "org/bert-base"
    assert request.revision == "main" and job.register is None
    # Without a name to show, the report shows what the run read (``cahp prune``'s case).
    plain = type(request)(model_ref="m", dataset_ref="d", output_dir=tmp_path, config=PruningConfig())
    assert (plain.model_shown, plain.dataset_shown) == ("m", "d")


def test_a_stored_dataset_option_the_engine_refuses_fails_with_its_name(tmp_path: Path) -> None:
    job = JobDefinition.of(_row(dataset={"uri": "file:///data/d", "train_split": "../etc"}))
    with pytest.raises(DatasetError, match="train_split"):
        job.dataset.options()
