"""The S3 artifact store against moto's S3 server over real HTTP (no patched functions)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from fastapi.testclient import TestClient

from app.core.errors import ResourceNotFoundError
from app.core.settings import Settings
from app.core.storage import S3Store, open_store
from tests.support.helpers import migrated_engine, moto_s3_server, new_key, service_settings


@pytest.fixture
def s3_endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with moto_s3_server() as endpoint:
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="cahp-artifacts")
        yield endpoint


@pytest.fixture
def s3_settings(tmp_path: Path, s3_endpoint: str) -> Settings:
    # moto listens on loopback, which outbound URLs may reach only when allowed (app.core.security._outbound).
    return service_settings(tmp_path, artifact_store="s3://cahp-artifacts/team-a", s3_endpoint_url=s3_endpoint,
                            s3_region="us-east-1", allowed_outbound_hosts=("127.0.0.1",),
                            allowed_s3_prefixes=("cahp-artifacts/models",))


def test_objects_round_trip_under_the_prefix(s3_settings: Settings, tmp_path: Path, s3_endpoint: str) -> None:
    store = open_store(s3_settings)
    assert isinstance(store, S3Store)
    source = tmp_path / "report.json"
    source.write_bytes(b'{"k": 1}' * 1000)
    store.put_file("jobs/j1/1/report.json", source, media_type="application/json")
    assert store.exists("jobs/j1/1/report.json") and not store.exists("jobs/j1/1/other.json")
    assert b"".join(store.iter_bytes("jobs/j1/1/report.json")) == source.read_bytes()
    store.download("jobs/j1/1/report.json", tmp_path / "copy.json")
    assert (tmp_path / "copy.json").read_bytes() == source.read_bytes()
    raw = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    head = raw.head_object(Bucket="cahp-artifacts", Key="team-a/jobs/j1/1/report.json")
    assert head["ContentType"] == "application/json"
    with pytest.raises(ResourceNotFoundError):
        store.iter_bytes("jobs/j1/1/missing.json")
    store.delete("jobs/j1/1/report.json")
    assert not store.exists("jobs/j1/1/report.json")
    with pytest.raises(ValueError):
        store.put_file("../escape", source, media_type="text/plain")


def test_the_api_stores_uploads_and_serves_artifacts_from_s3(s3_settings: Settings, s3_endpoint: str,
                                                              tmp_path: Path) -> None:
    from app.api.main import create_app
    from app.core.db import JobStatus, make_session_factory, repository, transaction
    from tests.support.helpers import job_body, write_tiny_dataset
    from worker.artifacts import store_artifacts

    engine = migrated_engine(s3_settings)
    auth = {"Authorization": f"Bearer {new_key(engine)}"}
    raw = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    with TestClient(create_app(s3_settings)) as client:
        upload = client.post("/v1/uploads", files={"file": ("train.csv", b"text,label\nfun,1\n")}, headers=auth)
        assert upload.status_code == 201, upload.text
        key = f"team-a/uploads/{upload.json()['id']}.csv"
        assert raw.get_object(Bucket="cahp-artifacts", Key=key)["Body"].read() == b"text,label\nfun,1\n"

        dataset = write_tiny_dataset(s3_settings.allowed_local_roots[0] / "data")
        job_id = client.post("/v1/jobs", json=job_body("s3://cahp-artifacts/models/tiny.tar.gz", f"file://{dataset}"),
                             headers=auth).json()["id"]
        out = tmp_path / "out"
        (out / "model").mkdir(parents=True)
        (out / "model" / "config.json").write_text("{}")
        (out / "mss_curve.json").write_text('{"ks": [1, 2]}')
        records = store_artifacts(out, ["mss_curve.json"], store=open_store(s3_settings), job_id=job_id, attempt=1)
        with transaction(make_session_factory(engine)) as session:
            repository.claim_job(session, job_id=job_id, worker_id="w")
            repository.finish_job(session, job_id=job_id, worker_id="w", status=JobStatus.succeeded, artifacts=records)
        for entry in client.get(f"/v1/jobs/{job_id}/artifacts", headers=auth).json()["data"]:
            body = client.get(entry["url"], headers=auth).content
            assert hashlib.sha256(body).hexdigest() == entry["sha256"]
    engine.dispose()
