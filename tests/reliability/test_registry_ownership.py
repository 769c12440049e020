"""The MLflow registry belongs to its owners, replayed as a hostile key holder would try it.

A real MLflow tracking server, the API and a real ``cahp worker`` process. Key A registers a model; key B
tries to add versions to A's model (its job's own registration and ``POST .../register``), to set cahp's
provenance tags or MLflow's (``cahp.job_id``, ``mlflow.user``) itself, and to register one job without
end. The operator's tracking URI carries a user and password: no answer, event or log line shows it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from mlflow import MlflowClient

from tests.support.helpers import new_key
from tests.support.mlflow_server import mlflow_server
from tests.support.stack import TERMINAL, Stack

SECRET = "s3cret-pw"
#: The server does not ask for credentials; the URI carries them as an operator's would.
STACK_SETTINGS: dict[str, Any] = {"allowed_outbound_hosts": ("127.0.0.1",), "max_registrations_per_job": 3}


@pytest.fixture(scope="module")
def registry(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, str]]:
    with mlflow_server(tmp_path_factory.mktemp("mlflow")) as url:
        with_credentials = url.replace("http://", f"http://operator:{SECRET}@")
        stack.settings = stack.settings.model_copy(update={"mlflow_tracking_uri": with_credentials})
        stack.client.app.state.settings = stack.settings  # type: ignore[attr-defined]
        stack.wait_ready(stack.start_worker("registry"))
        yield stack, url


def _submit(stack: Stack, key: str, register: dict[str, Any]) -> Any:
    model, data = stack.inputs()
    body = {"model": {"uri": model}, "dataset": {"uri": data}, "register": register,
            "params": {"epochs": 1, "dense_finetune": "never", "untrained_dense": "warn", "batch_size": 16,
                       "max_length": 32, "seed": 0,
                       "export": "none", "latency_repeats": 1}}
    return stack.client.post("/v1/jobs", json=body, headers={"Authorization": f"Bearer {key}"})


def _run(stack: Stack, key: str, register: dict[str, Any]) -> dict[str, Any]:
    response = _submit(stack, key, register)
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]
    return stack.wait_row(job_id, lambda r: r["status"] in TERMINAL, timeout=300, what="the job to end")


def test_another_keys_model_reserved_tags_and_endless_registrations_are_refused(
        registry: tuple[Stack, str]) -> None:
    stack, url = registry
    key_a, key_b = new_key(stack.engine, "team-a"), new_key(stack.engine, "team-b")
    a_headers, b_headers = ({"Authorization": f"Bearer {k}"} for k in (key_a, key_b))

    a_job = _run(stack, key_a, {"model_name": "team-a-model"})
    assert a_job["status"] == "succeeded", a_job
    mlflow = MlflowClient(tracking_uri=url, registry_uri=url)
    assert [v.version for v in mlflow.search_model_versions("name='team-a-model'")] == ["1"]

    # B may not write A's provenance, nor MLflow's own tags: refused at submit, with the reason.
    for tag in ("cahp.job_id", "mlflow.user", "CAHP.quality_warnings"):
        refused = _submit(stack, key_b, {"model_name": "team-b-model", "tags": {tag: a_job["id"]}})
        assert refused.status_code == 422, refused.text
        assert "set by the service" in refused.json()["detail"] and tag in refused.json()["detail"]

    # B's job asking for A's model name: the job's registration is refused before anything is logged.
    b_job = _run(stack, key_b, {"model_name": "team-a-model", "tags": {"team": "b"}})
    assert b_job["status"] == "failed" and b_job["error_code"] == "registration_failed", b_job
    assert "belongs to another API key" in b_job["error_message"]
    assert [v.version for v in mlflow.search_model_versions("name='team-a-model'")] == ["1"]

    # ... and so is B's request to register its own job there afterwards: 403, nothing written.
    stolen = stack.client.post(f"/v1/jobs/{b_job['id']}/register", json={"model_name": "team-a-model"},
                               headers=b_headers)
    assert stolen.status_code == 403 and stolen.json()["code"] == "registered_model_owned", stolen.text
    assert [v.version for v in mlflow.search_model_versions("name='team-a-model'")] == ["1"]
    a_version = mlflow.get_model_version("team-a-model", "1")
    assert a_version.tags["cahp.job_id"] == a_job["id"]

    # B's own name works, its tags beside cahp's provenance, which it cannot override.
    own = stack.client.post(f"/v1/jobs/{b_job['id']}/register",
                            json={"model_name": "team-b-model", "tags": {"team": "b"}}, headers=b_headers)
    assert own.status_code == 200, own.text
    version = mlflow.get_model_version("team-b-model", own.json()["version"])
    assert version.tags["cahp.job_id"] == b_job["id"] and version.tags["team"] == "b"
    # One job's registrations are bounded (tries count, refused ones too): its own, the stolen one, this
    # one, then 409 naming the setting.
    over = stack.client.post(f"/v1/jobs/{b_job['id']}/register", json={"model_name": "team-b-model"},
                             headers=b_headers)
    assert over.status_code == 409 and over.json()["code"] == "registration_limit_reached", over.text
    assert "CAHP_MAX_REGISTRATIONS_PER_JOB=3" in over.json()["detail"]
    assert len(mlflow.search_model_versions("name='team-b-model'")) == 1

    # A still adds versions to its own model.
    again = stack.client.post(f"/v1/jobs/{a_job['id']}/register", json={"model_name": "team-a-model"},
                              headers=a_headers)
    assert again.status_code == 200 and again.json()["version"] == "2", again.text

    # The operator's password is in no answer a key reads: job JSON, lists, events, logs, errors.
    seen = []
    for job_id, headers in ((a_job["id"], a_headers), (b_job["id"], b_headers)):
        for path in ("", "/logs", "/events"):
            response = stack.client.get(f"/v1/jobs/{job_id}{path}", headers=headers)
            assert response.status_code == 200, response.text
            seen.append(response.text)
        seen.append(stack.client.get("/v1/jobs", headers=headers).text)
    seen.append(json.dumps([own.json(), again.json()]))
    assert all(SECRET not in text for text in seen)
    job = stack.client.get(f"/v1/jobs/{a_job['id']}", headers=a_headers).json()
    assert job["registration"]["tracking_uri"] == url
    # Nor does the worker's own log (MLflow is never given the password in its address).
    assert all(SECRET not in worker.output() for worker in stack.workers)
