"""Jobs in a given state for API tests: submitted through the API, run to their end in the database."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import Engine

from app.core.db import JobStatus, make_session_factory, repository, transaction
from app.core.db.repository import ArtifactRecord
from app.core.settings import Settings
from app.core.storage import open_store
from tests.support.helpers import job_body, write_tiny_dataset


def submit(client: TestClient, auth: dict[str, str], settings: Settings, **extra: Any) -> str:
    """A queued job on a tiny local dataset; ``extra`` goes into the body (labels, notify_url)."""
    root = settings.allowed_local_roots[0] / "data"
    if not root.exists():
        write_tiny_dataset(root)
    response = client.post("/v1/jobs", json={**job_body("hf://org/model", f"file://{root}"), **extra}, headers=auth)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def start(engine: Engine, job_id: str, *, worker: str = "w") -> None:
    with transaction(make_session_factory(engine)) as session:
        assert repository.claim_job(session, job_id=job_id, worker_id=worker) is not None


def store(settings: Settings, job_id: str, files: dict[str, bytes], tmp: Path, *, attempt: int = 1
          ) -> list[ArtifactRecord]:
    """Store ``files`` as the job's artifacts, the way the worker does (``jobs/<id>/<attempt>/<name>``)."""
    records = []
    tmp.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        path = tmp / name
        path.write_bytes(data)
        key = f"jobs/{job_id}/{attempt}/{name}"
        open_store(settings).put_file(key, path, media_type="application/octet-stream")
        records.append(ArtifactRecord(name=name, size=len(data), sha256=hashlib.sha256(data).hexdigest(),
                                      media_type="application/octet-stream", storage_key=key))
    return records


def finish(engine: Engine, job_id: str, *, status: JobStatus = JobStatus.succeeded,
           artifacts: list[ArtifactRecord] | None = None, messages: list[str] | None = None,
           worker: str = "w") -> None:
    with transaction(make_session_factory(engine)) as session:
        assert repository.finish_job(session, job_id=job_id, worker_id=worker, status=status,
                                     error_code="pipeline_error" if status is JobStatus.failed else None,
                                     error_message="it broke" if status is JobStatus.failed else None,
                                     result={"k_star": 2} if status is JobStatus.succeeded else None,
                                     artifacts=artifacts or [], messages=messages or [])


def progress(engine: Engine, job_id: str, stage: str, fraction: float, *, messages: tuple[str, ...] = (),
             worker: str = "w") -> None:
    with transaction(make_session_factory(engine)) as session:
        assert repository.report_progress(session, job_id=job_id, worker_id=worker, stage=stage, progress=fraction,
                                          messages=messages).held


def record(engine: Engine, body: dict[str, Any], *, key_name: str | None = None) -> str:
    """A queued job put in the database without the API: what a submit recorded before the preflight
    checked inputs, for testing what the worker does with inputs submit now refuses."""
    import uuid

    from sqlalchemy import select

    from app.core.db import ApiKey, Job

    sessions = make_session_factory(engine)
    with transaction(sessions) as session:
        query = select(ApiKey.id) if key_name is None else select(ApiKey.id).where(ApiKey.name == key_name)
        owner = session.scalars(query.order_by(ApiKey.created_at)).first()
        assert owner is not None, "no API key to own the job"
        job_id = uuid.uuid4().hex
        repository.add_job(session, Job(
            id=job_id, owner_id=owner, status=JobStatus.queued.value, model_uri=body["model"]["uri"],
            model_revision=body["model"].get("revision"), dataset=dict(body["dataset"]),
            params=dict(body.get("params", {})), request_hash="recorded without the API"))
    return job_id
