"""API keys: required, hashed at rest, and a key sees only its own jobs and uploads."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from app.core.db import JobStatus, make_session_factory, repository, transaction
from app.core.db.repository import ArtifactRecord
from app.core.security import key_id_of
from tests.support.helpers import job_body, new_key, write_tiny_dataset


@pytest.fixture
def dataset_uri(local_root: Path) -> str:
    return f"file://{write_tiny_dataset(local_root / 'data')}"


@pytest.mark.parametrize("header", [None, "Bearer nonsense", "Bearer cahp_aaaaaaaaaaaa_" + "x" * 43, "Basic abc"])
def test_requests_without_a_valid_key_are_401(client: TestClient, header: str | None) -> None:
    headers = {"Authorization": header} if header else {}
    response = client.get("/v1/jobs", headers=headers)
    assert response.status_code == 401
    assert response.headers["content-type"] == "application/problem+json"
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert response.json()["code"] == "unauthenticated"


def test_keys_are_stored_only_as_hashes(key: str, engine: Engine) -> None:
    with engine.connect() as connection:
        rows = connection.execute(text("SELECT id, key_hash FROM api_keys")).all()
    assert [row.id for row in rows] == [key_id_of(key)]
    assert all(key not in str(value) for row in rows for value in row)


def test_another_keys_job_is_a_404_everywhere(
    client: TestClient, auth: dict[str, str], engine: Engine, dataset_uri: str
) -> None:
    job = client.post("/v1/jobs", json=job_body("hf://org/model", dataset_uri), headers=auth).json()
    # Give the job an artifact, so the download route would have something to serve.
    sessions = make_session_factory(engine)
    with transaction(sessions) as session:
        repository.claim_job(session, job_id=job["id"], worker_id="w")
        repository.finish_job(session, job_id=job["id"], worker_id="w", status=JobStatus.succeeded, artifacts=[
            ArtifactRecord(name="report.json", size=2, sha256="0" * 64, media_type="application/json",
                           storage_key="jobs/x/1/report.json")])
    mallory = {"Authorization": f"Bearer {new_key(engine, 'mallory')}"}
    for method, path in [("GET", ""), ("POST", "/cancel"), ("GET", "/logs"), ("GET", "/artifacts"),
                         ("GET", "/artifacts/report.json"), ("POST", "/register")]:
        response = client.request(method, f"/v1/jobs/{job['id']}{path}", headers=mallory)
        assert response.status_code == 404, (method, path)
        assert response.json()["code"] == "not_found"
    assert client.get("/v1/jobs", headers=mallory).json()["data"] == []
    assert client.get(f"/v1/jobs/{job['id']}", headers=auth).json()["status"] == "succeeded"


def test_another_keys_upload_cannot_be_used(client: TestClient, auth: dict[str, str], engine: Engine) -> None:
    upload = client.post("/v1/uploads", files={"file": ("train.csv", b"text,label\nfun film,1\n")}, headers=auth)
    assert upload.status_code == 201
    mallory = {"Authorization": f"Bearer {new_key(engine, 'mallory')}"}
    body = job_body("hf://org/model", upload.json()["uri"])
    body["dataset"]["eval_uri"] = upload.json()["uri"]
    response = client.post("/v1/jobs", json=body, headers=mallory)
    assert response.status_code == 422
    assert "not an upload of this API key" in response.json()["detail"]


def test_no_auth_mode_serves_requests_without_a_key(tmp_path: Path) -> None:
    from app.api.main import create_app
    from tests.support.helpers import migrated_engine, service_settings

    settings = service_settings(tmp_path, no_auth=True)
    engine = migrated_engine(settings)
    write_tiny_dataset(settings.allowed_local_roots[0] / "data")
    with TestClient(create_app(settings)) as client:
        job = client.post("/v1/jobs", json=job_body("hf://org/model", f"file://{settings.allowed_local_roots[0]}/data"))
        assert job.status_code == 202
        assert [j["id"] for j in client.get("/v1/jobs").json()["data"]] == [job.json()["id"]]
        # A real key still works, and still sees only its own jobs.
        other = {"Authorization": f"Bearer {new_key(engine)}"}
        assert client.get("/v1/jobs", headers=other).json()["data"] == []
        assert client.get("/v1/jobs", headers={"Authorization": "Bearer wrong"}).status_code == 401
    engine.dispose()
