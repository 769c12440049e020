"""What the API refuses about MLflow registration before any registry is contacted (the registry itself:
tests/e2e/test_mlflow_registry.py, against a real tracking server)."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import Engine

from app.api.main import create_app
from app.core.settings import Settings
from tests.support.helpers import job_body, migrated_engine, new_key, service_settings, write_tiny_dataset
from tests.support.jobs import finish, start, submit

REGISTER = {"register": {"model_name": "sst5-sentiment"}}


def _body(settings: Settings, **extra: object) -> dict[str, object]:
    root = settings.allowed_local_roots[0] / "data"
    if not root.exists():
        write_tiny_dataset(root)
    return {**job_body("hf://org/model", f"file://{root}"), **extra}


def test_register_on_a_server_without_a_registry_is_refused_at_submit(
    client: TestClient, auth: dict[str, str], settings: Settings
) -> None:
    response = client.post("/v1/jobs", json=_body(settings, **REGISTER), headers=auth)
    assert response.status_code == 422 and response.json()["code"] == "registry_not_configured"
    assert "CAHP_MLFLOW_TRACKING_URI" in response.json()["detail"] and "remove `register`" in response.json()["detail"]


def _with_registry(tmp_path: Path, uri: str, **overrides: object) -> tuple[Settings, Engine, dict[str, str]]:
    settings = service_settings(tmp_path, mlflow_tracking_uri=uri, **overrides)
    engine = migrated_engine(settings)
    return settings, engine, {"Authorization": f"Bearer {new_key(engine)}"}


def test_the_tracking_uri_passes_the_outbound_guard(tmp_path: Path) -> None:
    settings, engine, auth = _with_registry(tmp_path, "http://169.254.169.254/mlflow")
    with TestClient(create_app(settings)) as client:
        response = client.post("/v1/jobs", json=_body(settings, **REGISTER), headers=auth)
    assert response.status_code == 422 and response.json()["code"] == "outbound_url_refused"
    assert "CAHP_MLFLOW_TRACKING_URI" in response.json()["detail"]
    engine.dispose()


def test_a_job_names_a_model_and_tags_never_a_server_or_a_credential(tmp_path: Path) -> None:
    settings, engine, auth = _with_registry(tmp_path, "http://127.0.0.1:9", allowed_outbound_hosts=("127.0.0.1",))
    with TestClient(create_app(settings)) as client:
        for field in ("tracking_uri", "username", "password", "token"):
            body = _body(settings, register={"model_name": "m", field: "x"})
            response = client.post("/v1/jobs", json=body, headers=auth)
            assert response.status_code == 422 and f"register.{field}" in response.json()["detail"], field
        bad_name = client.post("/v1/jobs", json=_body(settings, register={"model_name": "../etc"}), headers=auth)
        assert bad_name.status_code == 422
        accepted = client.post("/v1/jobs", json=_body(settings, name="sst5-pruned", **REGISTER), headers=auth)
        assert accepted.status_code == 202, accepted.text
        job = accepted.json()
        assert job["register"] == {"model_name": "sst5-sentiment", "tags": {}, "description": None}
        assert job["name"] == "sst5-pruned" and job["registration"] is None
        # Nothing to register yet: the job has not succeeded.
        early = client.post(f"/v1/jobs/{job['id']}/register", headers=auth)
        assert early.status_code == 409 and "only a succeeded job" in early.json()["detail"]
    engine.dispose()


def test_registering_a_job_submitted_without_register_needs_a_model_name(tmp_path: Path) -> None:
    settings, engine, auth = _with_registry(tmp_path, "http://127.0.0.1:9", allowed_outbound_hosts=("127.0.0.1",))
    with TestClient(create_app(settings)) as client:
        job_id = submit(client, auth, settings)
        start(engine, job_id)
        finish(engine, job_id)
        response = client.post(f"/v1/jobs/{job_id}/register", headers=auth)
        assert response.status_code == 422 and "name the registered model" in response.json()["detail"]
        other = client.post(f"/v1/jobs/{'0' * 32}/register", json={"model_name": "m"}, headers=auth)
        assert other.status_code == 404
    engine.dispose()
