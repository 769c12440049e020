"""Mistakes refused at submit with the worker's own words: the job the worker would fail, refused at once.

Each case is sent twice: through ``POST /v1/jobs`` (the preflight answers 422), and as a job row put in
the database without the API (what a submit did before the preflight), run by the real worker logic
(``execute_job``) to its failure. The two messages must be the same.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from app.core.db import make_session_factory, repository, transaction
from app.core.settings import Settings
from app.core.storage import open_store
from tests.support import jobs
from tests.support.helpers import job_body, tar_directory, write_split, write_tiny_dataset, write_tiny_model
from worker.runner import Outcome, WorkerContext, execute_job


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model and dataset, written once for the module (the model takes a second to make)."""
    root = tmp_path_factory.mktemp("tiny")
    write_tiny_model(root / "model")
    write_tiny_dataset(root / "data")
    return root


def _upload(client: TestClient, auth: dict[str, str], directory: Path, tmp: Path) -> str:
    archive = tar_directory(directory, tmp / f"{directory.name}-{uuid.uuid4().hex[:6]}.tar.gz")
    response = client.post("/v1/uploads", files={"file": (archive.name, archive.read_bytes())}, headers=auth)
    assert response.status_code in (200, 201), response.text
    return str(response.json()["uri"])


def _refused(client: TestClient, auth: dict[str, str], body: dict[str, Any], code: str) -> str:
    response = client.post("/v1/jobs", json=body, headers=auth)
    assert response.status_code == 422, response.text
    assert response.json()["code"] == code, response.json()
    checked = client.post("/v1/jobs/check", json=body, headers=auth)
    assert checked.status_code == 422 and checked.json()["detail"] == response.json()["detail"]
    return str(response.json()["detail"])


def _worker_message(engine: Engine, settings: Settings, body: dict[str, Any]) -> str:
    """What the worker says when it runs ``body`` (recorded without the API, as before the preflight)."""
    job_id = jobs.record(engine, body, key_name="alice")
    sessions = make_session_factory(engine)
    context = WorkerContext(settings=settings, sessions=sessions, store=open_store(settings), worker_id="w")
    assert execute_job(job_id=job_id, context=context) is Outcome.failed
    with transaction(sessions) as session:
        job = repository.get_job(session, job_id=job_id)
        assert job is not None
        return str(job.error_message)


def test_a_wrong_label_column_is_refused_at_submit_as_the_worker_would_fail(
    client: TestClient, auth: dict[str, str], settings: Settings, engine: Engine, tiny: Path, tmp_path: Path,
) -> None:
    body = job_body(_upload(client, auth, tiny / "model", tmp_path), _upload(client, auth, tiny / "data", tmp_path))
    body["dataset"]["label_column"] = "labels"
    detail = _refused(client, auth, body, "invalid_dataset")
    assert "has no column 'labels'" in detail and "Set `label_column`" in detail
    assert detail == _worker_message(engine, settings, body)


def test_a_model_without_weights_is_refused_at_submit_as_the_worker_would_fail(
    client: TestClient, auth: dict[str, str], settings: Settings, engine: Engine, tiny: Path, tmp_path: Path,
) -> None:
    weightless = tmp_path / "weightless"
    shutil.copytree(tiny / "model", weightless)
    (weightless / "model.safetensors").unlink()
    body = job_body(_upload(client, auth, weightless, tmp_path), _upload(client, auth, tiny / "data", tmp_path))
    detail = _refused(client, auth, body, "model_not_loadable")
    assert detail == "'<model>/weightless' has no model.safetensors (nor a model.safetensors.index.json); cahp " \
                     "reads safetensors weights only"
    assert detail == _worker_message(engine, settings, body)


def test_a_model_of_an_unsupported_family_is_refused_at_submit(
    client: TestClient, auth: dict[str, str], settings: Settings, engine: Engine, tiny: Path, tmp_path: Path,
) -> None:
    other = tmp_path / "gpt"
    shutil.copytree(tiny / "model", other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    body = job_body(_upload(client, auth, other, tmp_path), _upload(client, auth, tiny / "data", tmp_path))
    detail = _refused(client, auth, body, "unsupported_model")
    assert detail.startswith("model type 'gpt2' is not supported")
    assert detail == _worker_message(engine, settings, body)


def test_a_config_declaring_more_layers_than_its_weights_is_refused_at_submit(
    client: TestClient, auth: dict[str, str], settings: Settings, engine: Engine, tiny: Path, tmp_path: Path,
) -> None:
    taller = tmp_path / "taller"
    shutil.copytree(tiny / "model", taller)
    config = json.loads((taller / "config.json").read_text())
    (taller / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 48}))
    body = job_body(_upload(client, auth, taller, tmp_path), _upload(client, auth, tiny / "data", tmp_path))
    detail = _refused(client, auth, body, "model_not_loadable")
    assert "declares 48 layers" in detail
    assert detail == _worker_message(engine, settings, body)


@pytest.mark.parametrize("case", ["one class", "unseen eval label", "missing text", "no eval split"])
def test_dataset_mistakes_in_a_local_directory_are_refused_with_the_workers_message(
    case: str, client: TestClient, auth: dict[str, str], settings: Settings, engine: Engine, tiny: Path,
    local_root: Path,
) -> None:
    data = local_root / f"data-{case.replace(' ', '-')}"
    write_tiny_dataset(data)
    if case == "one class":
        (data / "train.csv").write_text("text,label\n" + "".join(f"a film {i},1\n" for i in range(20)))
    elif case == "unseen eval label":
        (data / "test.csv").write_text("text,label\ngood,0\nodd,7\n")
    elif case == "missing text":
        (data / "test.csv").write_text('text,label\ngood,0\n"",1\n')
    else:
        (data / "test.csv").rename(data / "holdout.csv")
    shutil.copytree(tiny / "model", local_root / "model", dirs_exist_ok=True)
    body = job_body(f"file://{local_root / 'model'}", f"file://{data}")
    detail = _refused(client, auth, body, "invalid_dataset")
    assert detail == _worker_message(engine, settings, body)


def test_split_files_given_as_uri_and_eval_uri_are_checked_under_the_split_names_the_worker_gives_them(
    client: TestClient, auth: dict[str, str], settings: Settings, engine: Engine, tiny: Path, tmp_path: Path,
) -> None:
    train = write_split(tmp_path / "mine.csv", 30, seed=1)
    (tmp_path / "eval.csv").write_text("text,label\ngood,0\nodd,9\n")
    uris = []
    for path in (train, tmp_path / "eval.csv"):
        response = client.post("/v1/uploads", files={"file": (path.name, path.read_bytes())}, headers=auth)
        uris.append(response.json()["uri"])
    body = job_body(_upload(client, auth, tiny / "model", tmp_path), uris[0])
    body["dataset"]["eval_uri"] = uris[1]
    detail = _refused(client, auth, body, "invalid_dataset")
    assert "<dataset>/test.csv has labels ['9']" in detail
    assert detail == _worker_message(engine, settings, body)


def test_check_answers_what_it_checked_and_leaves_hub_inputs_to_the_worker(
    client: TestClient, auth: dict[str, str], tiny: Path, tmp_path: Path,
) -> None:
    body = job_body(_upload(client, auth, tiny / "model", tmp_path), _upload(client, auth, tiny / "data", tmp_path))
    checked = client.post("/v1/jobs/check", json=body, headers=auth)
    assert checked.status_code == 200, checked.text
    assert any(line.startswith("model: bert config") for line in checked.json()["checked"])
    assert any(line.startswith("dataset:") for line in checked.json()["checked"]) and checked.json()["skipped"] == []
    assert client.get("/v1/jobs", headers=auth).json()["data"] == []  # nothing was queued
    hub = client.post("/v1/jobs/check", json=job_body("hf://org/model", body["dataset"]["uri"]), headers=auth)
    assert hub.status_code == 200 and hub.json()["skipped"] == [
        "model hf://org/model: checked by the worker (hf:// inputs are fetched there)"]
