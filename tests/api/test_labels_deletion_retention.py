"""Labels and their filter, deleting finished jobs, artifact retention, and byte ranges on downloads.

Storage cases run on the local store and on S3 (moto's server over real HTTP).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, update

from app.api.background import JobQueue, sweep_once
from app.api.result_schemas import JobResult
from app.core.db import Job, make_session_factory, transaction
from app.core.settings import Settings
from app.core.storage import open_store
from tests.support.helpers import moto_s3_server, service_settings
from tests.support.jobs import finish, start, store, submit

BUCKET = "cahp-artifacts"
BLOB = os.urandom(300_000)


@pytest.fixture(params=["local", "s3"])
def settings(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    if request.param == "local":
        yield service_settings(tmp_path)
        return
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                        ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    with moto_s3_server() as endpoint:
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=BUCKET)
        yield service_settings(tmp_path, artifact_store=f"s3://{BUCKET}/team", s3_endpoint_url=endpoint,
                               s3_region="us-east-1", allowed_outbound_hosts=("127.0.0.1",))


def _stored(settings: Settings, job_id: str) -> list[str]:
    """Every object under the job's prefix, as the store holds it."""
    if settings.s3_store:
        client = boto3.client("s3", endpoint_url=settings.s3_endpoint_url, region_name="us-east-1")
        listed = client.list_objects_v2(Bucket=BUCKET, Prefix=f"team/jobs/{job_id}/")
        return sorted(item["Key"] for item in listed.get("Contents", []))
    root = Path(settings.resolved_artifact_store) / "jobs" / job_id
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) if root.exists() else []


def _finished(client: TestClient, auth: dict[str, str], engine: Engine, settings: Settings, tmp: Path,
              **extra: object) -> str:
    job_id = submit(client, auth, settings, **extra)
    start(engine, job_id)
    finish(engine, job_id, artifacts=store(settings, job_id, {"model.bin": BLOB, "report.json": b"{}"}, tmp / job_id))
    return job_id


def test_labels_are_kept_and_filter_the_list(client: TestClient, auth: dict[str, str], settings: Settings) -> None:
    main = submit(client, auth, settings, labels={"branch": "main", "git/commit": "4f2c9e1"})
    feature = submit(client, auth, settings, labels={"branch": "feature/x", "model": "bert:tiny"})
    submit(client, auth, settings)
    assert client.get(f"/v1/jobs/{main}", headers=auth).json()["labels"] == {"branch": "main", "git/commit": "4f2c9e1"}

    def ids(*selectors: str) -> list[str]:
        response = client.get("/v1/jobs", params=[("label", s) for s in selectors], headers=auth)
        assert response.status_code == 200, response.text
        return [job["id"] for job in response.json()["data"]]

    assert ids("branch:main") == [main]
    assert ids("branch:feature/x") == [feature] and ids("model:bert:tiny") == [feature]  # values may hold ":"
    assert ids("branch:main", "git/commit:4f2c9e1") == [main] and ids("branch:main", "model:bert:tiny") == []
    assert len(ids()) == 3
    for bad in ("branch", ":main", "bad key:x"):
        assert client.get("/v1/jobs", params={"label": bad}, headers=auth).status_code == 422


@pytest.mark.parametrize("labels", [
    {"-leading": "x"}, {"trailing-": "x"}, {"a" * 64: "x"}, {"ok": "v" * 256}, {"ok": "line\nbreak"},
    {f"k{i}": "v" for i in range(21)},
])
def test_labels_out_of_bounds_are_refused(client: TestClient, auth: dict[str, str], labels: dict[str, str]) -> None:
    body = {"model": {"uri": "hf://a/b"}, "dataset": {"uri": "hf://datasets/c/d"}, "labels": labels}
    response = client.post("/v1/jobs", json=body, headers=auth)
    assert response.status_code == 422 and "label" in response.json()["detail"], response.text


def test_a_finished_job_is_deleted_with_its_stored_files_and_a_running_one_is_not(
    client: TestClient, auth: dict[str, str], engine: Engine, settings: Settings, tmp_path: Path
) -> None:
    done = _finished(client, auth, engine, settings, tmp_path)
    assert len(_stored(settings, done)) == 2
    running = submit(client, auth, settings)
    start(engine, running)
    queued = submit(client, auth, settings)
    for busy in (running, queued):
        response = client.delete(f"/v1/jobs/{busy}", headers=auth)
        assert response.status_code == 409 and response.json()["code"] == "job_not_finished"
    assert client.delete(f"/v1/jobs/{done}", headers=auth).status_code == 204
    assert _stored(settings, done) == []
    for path in ("", "/logs", "/artifacts", "/artifacts/model.bin", "/events", "/deliveries"):
        assert client.get(f"/v1/jobs/{done}{path}", headers=auth).status_code == 404, path
    assert client.delete(f"/v1/jobs/{done}", headers=auth).status_code == 404
    assert client.get(f"/v1/jobs/{running}", headers=auth).status_code == 200


def test_retention_removes_old_artifacts_marks_the_job_and_spares_running_jobs(
    client: TestClient, auth: dict[str, str], engine: Engine, settings: Settings, tmp_path: Path
) -> None:
    old = _finished(client, auth, engine, settings, tmp_path)
    recent = _finished(client, auth, engine, settings, tmp_path)
    running = submit(client, auth, settings)
    start(engine, running)
    store(settings, running, {"partial.bin": b"still being written"}, tmp_path / "running")
    with transaction(make_session_factory(engine)) as session:
        session.execute(update(Job).where(Job.id == old)
                        .values(finished_at=dt.datetime.now(dt.UTC) - dt.timedelta(days=8)))
    kept = settings.model_copy(update={"artifact_ttl_days": 7.0})
    report = sweep_once(sessions=make_session_factory(engine), queue=JobQueue(kept), store=open_store(kept),
                        settings=kept)
    assert report.artifacts_expired == (old,)
    assert _stored(settings, old) == [] and len(_stored(settings, recent)) == 2 and len(_stored(settings, running)) == 1
    job = client.get(f"/v1/jobs/{old}", headers=auth).json()
    # The result survives expiry: every summary field the API documents, the stored k_star, the rest unset.
    assert job["artifacts_expired"] is True and job["status"] == "succeeded" and job["result"] == {
        **dict.fromkeys(JobResult.model_fields), "k_star": 2}
    for path in ("/artifacts", "/artifacts/model.bin"):
        response = client.get(f"/v1/jobs/{old}{path}", headers=auth)
        assert response.status_code == 410 and response.json()["code"] == "artifacts_expired"
    assert client.get(f"/v1/jobs/{recent}/artifacts", headers=auth).status_code == 200
    again = sweep_once(sessions=make_session_factory(engine), queue=JobQueue(kept), store=open_store(kept),
                       settings=kept)
    assert again.artifacts_expired == ()


def test_downloads_honour_byte_ranges(client: TestClient, auth: dict[str, str], engine: Engine, settings: Settings,
                                      tmp_path: Path) -> None:
    job_id = _finished(client, auth, engine, settings, tmp_path)
    url = f"/v1/jobs/{job_id}/artifacts/model.bin"
    etag = f'"{hashlib.sha256(BLOB).hexdigest()}"'
    whole = client.get(url, headers=auth)
    assert whole.status_code == 200 and whole.content == BLOB and whole.headers["accept-ranges"] == "bytes"
    size = len(BLOB)
    for header, start_, end in (("bytes=10-19", 10, 19), ("bytes=100000-", 100000, size - 1),
                                ("bytes=-5", size - 5, size - 1), ("bytes=299990-400000", 299990, size - 1)):
        part = client.get(url, headers={**auth, "Range": header, "If-Range": etag})
        assert part.status_code == 206, header
        assert part.content == BLOB[start_:end + 1]
        assert part.headers["content-range"] == f"bytes {start_}-{end}/{size}"
        assert int(part.headers["content-length"]) == end - start_ + 1
    unsatisfiable = client.get(url, headers={**auth, "Range": f"bytes={size}-"})
    assert unsatisfiable.status_code == 416 and unsatisfiable.headers["content-range"] == f"bytes */{size}"
    # A stale If-Range, several ranges or nonsense: the whole artifact, as RFC 9110 says.
    for headers in ({"Range": "bytes=10-19", "If-Range": '"0000"'}, {"Range": "bytes=0-1,5-6"}, {"Range": "rows=1-2"}):
        response = client.get(url, headers={**auth, **headers})
        assert response.status_code == 200 and response.content == BLOB
