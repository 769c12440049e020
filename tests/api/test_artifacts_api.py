"""The artifact manifest and downloads, from objects stored the way the worker stores them."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import Engine

from app.core.db import JobStatus, make_session_factory, repository, transaction
from app.core.settings import Settings
from app.core.storage import open_store
from tests.support.helpers import job_body, write_tiny_dataset
from worker.artifacts import store_artifacts


def _finished_job(client: TestClient, auth: dict[str, str], engine: Engine, settings: Settings, out: Path) -> str:
    dataset = write_tiny_dataset(settings.allowed_local_roots[0] / "data")
    submitted = client.post("/v1/jobs", json=job_body("hf://org/model", f"file://{dataset}"), headers=auth)
    job_id: str = submitted.json()["id"]
    (out / "model").mkdir(parents=True)
    (out / "model" / "config.json").write_text('{"model_type": "bert"}')
    (out / "report.json").write_text(json.dumps({"summary": {"k_star": 2}}))
    (out / "head_map.png").write_bytes(b"\x89PNG fake image bytes")
    records = store_artifacts(out, ["report.json", "head_map.png"], store=open_store(settings), job_id=job_id,
                              attempt=1)
    with transaction(make_session_factory(engine)) as session:
        repository.claim_job(session, job_id=job_id, worker_id="w")
        repository.finish_job(session, job_id=job_id, worker_id="w", status=JobStatus.succeeded,
                              result={"k_star": 2, "heads_total": 8}, artifacts=records)
    return job_id


def test_manifest_and_downloads_match_byte_for_byte(
    client: TestClient, auth: dict[str, str], engine: Engine, settings: Settings, tmp_path: Path
) -> None:
    job_id = _finished_job(client, auth, engine, settings, tmp_path / "out")
    job = client.get(f"/v1/jobs/{job_id}", headers=auth).json()
    assert job["status"] == "succeeded" and job["progress"] == 1.0
    assert job["result"]["k_star"] == 2 and job["result"]["speedup"] is None
    manifest = client.get(f"/v1/jobs/{job_id}/artifacts", headers=auth).json()
    assert manifest["next_cursor"] is None
    by_name = {a["name"]: a for a in manifest["data"]}
    assert set(by_name) == {"model.tar.gz", "report.json", "head_map.png"}
    assert by_name["head_map.png"]["media_type"] == "image/png"
    for name, entry in by_name.items():
        response = client.get(entry["url"], headers=auth)
        assert response.status_code == 200
        assert hashlib.sha256(response.content).hexdigest() == entry["sha256"]
        assert int(response.headers["content-length"]) == entry["size"] == len(response.content)
        assert response.headers["etag"] == f'"{entry["sha256"]}"'
        assert response.headers["content-type"].startswith(entry["media_type"])
        assert name in response.headers["content-disposition"]
    model = client.get(by_name["model.tar.gz"]["url"], headers=auth).content
    with tarfile.open(fileobj=io.BytesIO(model)) as tar:
        assert sorted(tar.getnames()) == ["model", "model/config.json"]


def test_unknown_and_traversing_artifact_names_are_404(
    client: TestClient, auth: dict[str, str], engine: Engine, settings: Settings, tmp_path: Path
) -> None:
    job_id = _finished_job(client, auth, engine, settings, tmp_path / "out")
    for name in ("mss_curve.json", "..%2F..%2F..%2Fcahp.db", "%2E%2E", "model"):
        response = client.get(f"/v1/jobs/{job_id}/artifacts/{name}", headers=auth)
        assert response.status_code == 404, name
        assert response.headers["content-type"] == "application/problem+json"


def test_an_unfinished_job_has_an_empty_manifest(client: TestClient, auth: dict[str, str], settings: Settings) -> None:
    dataset = write_tiny_dataset(settings.allowed_local_roots[0] / "data")
    job = client.post("/v1/jobs", json=job_body("hf://org/model", f"file://{dataset}"), headers=auth).json()
    assert client.get(f"/v1/jobs/{job['id']}/artifacts", headers=auth).json() == {"data": [], "next_cursor": None}
