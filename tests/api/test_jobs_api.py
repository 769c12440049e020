"""Submitting, reading, listing and cancelling jobs over HTTP, on a fresh database per test."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from app.core.settings import Settings
from tests.support.helpers import job_body, write_tiny_dataset


def _broker_messages(settings: Settings) -> list[dict[str, Any]]:
    """The messages waiting in the embedded broker (kombu's SQLite tables), decoded."""
    from sqlalchemy import create_engine

    engine = create_engine(f"sqlite:///{settings.data_dir / 'broker.db'}")
    try:
        with engine.connect() as connection:
            rows = connection.execute(text("SELECT payload FROM kombu_message WHERE visible = 1")).all()
    finally:
        engine.dispose()
    return [json.loads(row[0]) for row in rows]


@pytest.fixture
def dataset_uri(local_root: Path) -> str:
    return f"file://{write_tiny_dataset(local_root / 'data')}"


def _problem(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert body["status"] == status and body["code"] == code and body["detail"]
    return body


def test_submit_records_a_queued_job_and_enqueues_only_its_id(
    client: TestClient, auth: dict[str, str], dataset_uri: str, settings: Settings
) -> None:
    response = client.post("/v1/jobs", json=job_body("hf://org/model", dataset_uri, poly_degree=3), headers=auth)
    assert response.status_code == 202, response.text
    job = response.json()
    assert response.headers["location"] == f"/v1/jobs/{job['id']}"
    assert job["status"] == "queued" and job["progress"] == 0.0 and job["stage"] is None
    assert job["params"]["poly_degree"] == 3 and job["params"]["epochs"] == 1
    assert "device" not in job["params"]  # the worker's setting
    # Unset settings show their defaults: the stopping rules decide the sample counts.
    assert job["params"]["calibration_fraction"] == "auto" and job["params"]["signature_samples"] == "auto"
    assert job["error"] is None and job["result"] is None and job["started_at"] is None
    assert job["dataset"]["uri"] == dataset_uri and job["dataset"]["text_column"] == "text"
    messages = _broker_messages(settings)
    assert len(messages) == 1
    assert messages[0]["headers"]["task"] == "cahp.run_job"
    args, kwargs, _embed = json.loads(base64.b64decode(messages[0]["body"]))
    assert (args, kwargs) == ([job["id"]], {})
    assert client.get(f"/v1/jobs/{job['id']}", headers=auth).json() == job


@pytest.mark.parametrize(
    ("params", "code", "fragment"),
    [
        ({"poly_degree": 0}, "invalid_config", "poly_degree"),
        ({"calibration_fraction": 1.5}, "invalid_config", "calibration_fraction"),
        ({"epochs": -1}, "invalid_config", "epochs"),
        ({"poly_degree": "2"}, "invalid_request", "poly_degree"),
        ({"strategy": "best"}, "invalid_request", "strategy"),
        ({"polydegree": 2}, "invalid_request", "polydegree"),
        ({"device": "cuda:0"}, "invalid_request", "device"),
        ({"target_speedup": 0.5}, "invalid_config", "`target_speedup` must be a number in [1.0, 1000.0], got 0.5"),
        ({"target_flops": 0.5, "heads_to_keep": 4}, "invalid_config", "`heads_to_keep` fixes the count"),
        ({"target_speedup": 2.0, "max_accuracy_drop": 1.0}, "invalid_config",
         "for the fastest model within the budget leave `target_speedup` unset and set `budget_objective` to 'speed'"),
        ({"budget_objective": "speed", "max_accuracy_drop": 1.0, "recovery": "reconstruct", "heads_to_keep": 4},
         "invalid_config", "`max_accuracy_drop` searches for the head count and `heads_to_keep` fixes it"),
        ({"budget_objective": "speed", "max_accuracy_drop": 1.0, "recovery": "finetune"}, "invalid_config",
         "judges its candidates after layer-wise reconstruction; set `recovery` to 'reconstruct'"),
        ({"budget_objective": "fastest"}, "invalid_request", "budget_objective"),
        ({"target_runtime": "tensorrt"}, "invalid_request", "target_runtime"),
    ],
)
def test_bad_params_are_422_problems_naming_the_setting(
    client: TestClient, auth: dict[str, str], dataset_uri: str, params: dict[str, Any], code: str, fragment: str
) -> None:
    response = client.post("/v1/jobs", json=job_body("hf://org/model", dataset_uri, **params), headers=auth)
    body = _problem(response, 422, code)
    assert fragment in body["detail"]


def test_malformed_json_and_unknown_fields_are_422(client: TestClient, auth: dict[str, str], dataset_uri: str) -> None:
    raw = client.post("/v1/jobs", content=b'{"model": ', headers={**auth, "content-type": "application/json"})
    _problem(raw, 422, "invalid_request")
    extra = job_body("hf://org/model", dataset_uri)
    extra["priority"] = "high"
    body = _problem(client.post("/v1/jobs", json=extra, headers=auth), 422, "invalid_request")
    assert any(e["loc"][-1] == "priority" for e in body["errors"])
    missing = {"model": {"uri": "hf://org/model"}}
    _problem(client.post("/v1/jobs", json=missing, headers=auth), 422, "invalid_request")


@pytest.mark.parametrize(
    ("model", "dataset", "fragment"),
    [
        ("ftp://host/model", "hf://datasets/org/data", "unknown scheme"),
        ("org/model", "hf://datasets/org/data", "no scheme"),
        ("hf://datasets/org/data", "hf://datasets/org/data", "names a hub dataset"),
        ("hf://org/../etc", "hf://datasets/org/data", "not a hub id"),
        ("file:///etc", "hf://datasets/org/data", "not in a directory this server may read"),
        ("upload://" + "0" * 32, "hf://datasets/org/data", "not an upload of this API key"),
        ("s3://bucket/model.tar.gz", "hf://datasets/org/data", "s3:// references are disabled"),
        ("hf://org/model", "file:///nonexistent/data", "not in a directory this server may read"),
    ],
)
def test_unusable_references_are_422(
    client: TestClient, auth: dict[str, str], model: str, dataset: str, fragment: str
) -> None:
    body = _problem(client.post("/v1/jobs", json=job_body(model, dataset), headers=auth), 422, "invalid_reference")
    assert fragment in body["detail"]


def test_a_symlink_out_of_an_allowed_root_is_refused(
    client: TestClient, auth: dict[str, str], local_root: Path, tmp_path: Path
) -> None:
    outside = write_tiny_dataset(tmp_path / "outside")
    (local_root / "sneaky").symlink_to(outside)
    body = _problem(client.post("/v1/jobs", json=job_body("hf://org/model", f"file://{local_root}/sneaky"),
                                headers=auth), 422, "invalid_reference")
    assert "not in a directory this server may read" in body["detail"]


def test_a_single_split_file_needs_an_eval_file(
    client: TestClient, auth: dict[str, str], local_root: Path, dataset_uri: str
) -> None:
    train = f"{dataset_uri}/train.csv"
    body = _problem(client.post("/v1/jobs", json=job_body("hf://org/model", train), headers=auth),
                    422, "invalid_reference")
    assert "eval_uri" in body["detail"]
    paired = job_body("hf://org/model", train)
    paired["dataset"]["eval_uri"] = f"{dataset_uri}/test.csv"
    assert client.post("/v1/jobs", json=paired, headers=auth).status_code == 202
    model_file = job_body(f"{dataset_uri}/train.csv", dataset_uri)
    _problem(client.post("/v1/jobs", json=model_file, headers=auth), 422, "invalid_reference")


def test_dataset_options_are_checked_at_submit(client: TestClient, auth: dict[str, str], dataset_uri: str) -> None:
    body = job_body("hf://org/model", dataset_uri)
    body["dataset"].update(train_split="train", eval_split="train")
    _problem(client.post("/v1/jobs", json=body, headers=auth), 422, "invalid_dataset")


def test_idempotency_key_returns_the_first_job_and_refuses_a_different_body(
    client: TestClient, auth: dict[str, str], dataset_uri: str, settings: Settings, engine: Engine
) -> None:
    headers = {**auth, "Idempotency-Key": "ci-run-42"}
    first = client.post("/v1/jobs", json=job_body("hf://org/model", dataset_uri), headers=headers)
    again = client.post("/v1/jobs", json=job_body("hf://org/model", dataset_uri), headers=headers)
    assert first.status_code == again.status_code == 202
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["idempotent-replayed"] == "true" and "idempotent-replayed" not in first.headers
    assert len(_broker_messages(settings)) == 1  # the repeat enqueued nothing
    changed = client.post("/v1/jobs", json=job_body("hf://org/model", dataset_uri, epochs=2), headers=headers)
    assert "ci-run-42" not in _problem(changed, 422, "idempotency_key_reused")["detail"]
    other = client.post("/v1/jobs", json=job_body("hf://org/model", dataset_uri),
                        headers={**auth, "Idempotency-Key": "ci-run-43"})
    assert other.json()["id"] != first.json()["id"]
    _problem(client.post("/v1/jobs", json=job_body("hf://org/model", dataset_uri),
                         headers={**auth, "Idempotency-Key": "bad key with spaces"}), 422, "invalid_request")
    with engine.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM jobs")).scalar_one() == 2


def test_list_pages_with_a_cursor_and_filters_by_status(
    client: TestClient, auth: dict[str, str], dataset_uri: str
) -> None:
    ids = [client.post("/v1/jobs", json=job_body("hf://org/model", dataset_uri, seed=i), headers=auth).json()["id"]
           for i in range(5)]
    client.post(f"/v1/jobs/{ids[0]}/cancel", headers=auth)
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        page = client.get("/v1/jobs", params=params, headers=auth).json()
        seen.extend(job["id"] for job in page["data"])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(ids))
    cancelled = client.get("/v1/jobs", params={"status": "cancelled"}, headers=auth).json()
    assert [job["id"] for job in cancelled["data"]] == [ids[0]] and cancelled["next_cursor"] is None
    _problem(client.get("/v1/jobs", params={"cursor": "garbage!"}, headers=auth), 422, "invalid_request")
    _problem(client.get("/v1/jobs", params={"limit": 0}, headers=auth), 422, "invalid_request")
    _problem(client.get("/v1/jobs", params={"status": "exploded"}, headers=auth), 422, "invalid_request")


def test_cancel_a_queued_job_then_again(client: TestClient, auth: dict[str, str], dataset_uri: str) -> None:
    job = client.post("/v1/jobs", json=job_body("hf://org/model", dataset_uri), headers=auth).json()
    first = client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth)
    assert first.status_code == 202
    cancelled = first.json()
    assert cancelled["status"] == "cancelled" and cancelled["finished_at"] is not None
    assert cancelled["error"]["code"] == "cancelled"
    assert client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth).json()["status"] == "cancelled"
    _problem(client.post("/v1/jobs/nope/cancel", headers=auth), 404, "not_found")


def test_a_submit_while_the_broker_is_down_is_kept_queued_for_the_sweeper(
    tmp_path: Path, dataset_uri: str, local_root: Path
) -> None:
    from app.api.main import create_app
    from tests.support.helpers import free_port, migrated_engine, new_key, service_settings

    # A Redis URL on a port where nothing listens: the broker is down.
    settings = service_settings(tmp_path, broker_url=f"redis://127.0.0.1:{free_port()}/0",
                                allowed_local_roots=(local_root,))
    engine = migrated_engine(settings)
    key = new_key(engine)
    with TestClient(create_app(settings)) as client:
        response = client.post("/v1/jobs", json=job_body("hf://org/model", dataset_uri),
                               headers={"Authorization": f"Bearer {key}"})
        assert response.status_code == 202, response.text
        assert response.json()["status"] == "queued"
        ready = client.get("/readyz")
        _problem(ready, 503, "service_unavailable")
        assert ready.headers["retry-after"]
    with engine.connect() as connection:
        # Recorded, and marked as never sent: the sweeper sends it once the broker answers.
        row = connection.execute(text("SELECT status, enqueued_at FROM jobs")).one()
        assert tuple(row) == ("queued", None)
    engine.dispose()


def test_logs_page_by_offset(client: TestClient, auth: dict[str, str], dataset_uri: str, engine: Engine) -> None:
    from app.core.db import make_session_factory, repository, transaction

    job = client.post("/v1/jobs", json=job_body("hf://org/model", dataset_uri), headers=auth).json()
    with transaction(make_session_factory(engine)) as session:
        repository.append_logs(session, job_id=job["id"], messages=[f"line {i}" for i in range(5)])
    first = client.get(f"/v1/jobs/{job['id']}/logs", params={"limit": 3}, headers=auth).json()
    assert [line["message"] for line in first["data"]] == ["line 0", "line 1", "line 2"]
    rest = client.get(f"/v1/jobs/{job['id']}/logs", params={"offset": first["next_offset"]}, headers=auth).json()
    assert [line["offset"] for line in rest["data"]] == [3, 4] and rest["next_offset"] == 5
    empty = client.get(f"/v1/jobs/{job['id']}/logs", params={"offset": 5}, headers=auth).json()
    assert empty == {"data": [], "next_offset": 5}
    _problem(client.get(f"/v1/jobs/{job['id']}/logs", params={"offset": -1}, headers=auth), 422, "invalid_request")


def test_unknown_routes_and_methods_are_problems(client: TestClient, auth: dict[str, str]) -> None:
    _problem(client.get("/v1/nothing", headers=auth), 404, "not_found")
    _problem(client.delete("/v1/jobs", headers=auth), 405, "method_not_allowed")
    _problem(client.get("/v1/jobs/unknown-id", headers=auth), 404, "not_found")


def test_a_dataset_configuration_is_accepted_and_checked(client: TestClient, auth: dict[str, str]) -> None:
    body = job_body("hf://org/model", "hf://datasets/nyu-mll/glue")
    body["dataset"].update(config="mnli", text_column="premise", text_pair_column="hypothesis",
                           eval_split="validation_mismatched")
    job = client.post("/v1/jobs", json=body, headers=auth)
    assert job.status_code == 202, job.text
    assert job.json()["dataset"]["config"] == "mnli" and job.json()["dataset"]["eval_split"] == "validation_mismatched"
    body["dataset"]["config"] = "../mnli"
    refused = _problem(client.post("/v1/jobs", json=body, headers=auth), 422, "invalid_dataset")
    assert "`config` must be a dataset configuration name" in refused["detail"]
