"""A worker that is still alive after its job was taken over (a long pause, a lost network) stops,
writes nothing, and leaves no artifact in the store: only the new holder's attempt is ever served. (The
resume state it saved while it held the job stays: it is the job's, for the new holder to resume from.)

These run the worker's own code (:func:`worker.runner.execute_job`) with the real engine in this
process; the take-over is what :func:`app.core.db.repository.claim_job` does once the lease expired.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, update

from app.core.db import Job, make_session_factory, repository, transaction
from app.core.settings import Settings
from app.core.storage import open_store
from cahp_engine.run import RunHooks, RunReport, RunRequest, run_pruning
from tests.support.helpers import job_body, service_settings, write_tiny_dataset, write_tiny_model
from worker import runner
from worker.runner import Outcome, WorkerContext, execute_job


@pytest.fixture
def api_key(key: str) -> str:
    """The client sends a valid key."""
    return key


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    # Progress and cancel checks are rare here, so only the heartbeat can notice a take-over.
    return service_settings(tmp_path, lease_s=3.0, heartbeat_interval_s=0.1, progress_interval_s=1000.0,
                            cancel_check_interval_s=1000.0)


@pytest.fixture
def job_id(client: TestClient, settings: Settings) -> str:
    local = settings.allowed_local_roots[0]
    body = job_body(f"file://{write_tiny_model(local / 'model')}", f"file://{write_tiny_dataset(local / 'data')}",
                    epochs=20, batch_size=2)
    return str(client.post("/v1/jobs", json=body).json()["id"])


@pytest.fixture
def context(settings: Settings, engine: Engine) -> WorkerContext:
    return WorkerContext(settings=settings, sessions=make_session_factory(engine), store=open_store(settings),
                         worker_id="paused-worker")


def _take_over(engine: Engine, job_id: str) -> None:
    with transaction(make_session_factory(engine)) as session:
        session.execute(update(Job).where(Job.id == job_id).values(worker_id="new-holder", attempts=2))


def _stored(settings: Settings, job_id: str) -> list[Path]:
    """The job's artifacts in the store (its resume state, under ``checkpoints/``, is not an artifact)."""
    root = settings.data_dir / "artifacts" / "jobs" / job_id
    if not root.exists():
        return []
    return sorted(p for p in root.rglob("*") if p.is_file() and "checkpoints" not in p.relative_to(root).parts)


def test_the_heartbeat_stops_a_worker_whose_job_was_taken_over_mid_run(
    client: TestClient, settings: Settings, engine: Engine, job_id: str, context: WorkerContext
) -> None:
    recovery_steps: list[float] = []

    def taken_over_while_training(request: RunRequest, hooks: RunHooks) -> RunReport:
        progress = hooks.progress
        assert progress is not None

        def hook(stage: str, fraction: float) -> None:
            if stage == "recovery":
                recovery_steps.append(fraction)
                if len(recovery_steps) == 3:
                    _take_over(engine, job_id)
            progress(stage, fraction)

        return run_pruning(request, dataclasses.replace(hooks, progress=hook))

    assert execute_job(job_id=job_id, context=context, pipeline=taken_over_while_training) is Outcome.skipped
    assert 3 <= len(recovery_steps) < 600  # it stopped during recovery, long before its 600 steps
    row = client.get(f"/v1/jobs/{job_id}").json()
    assert row["status"] == "running" and row["stage"] == "recovery"  # as the new holder left it
    assert client.get(f"/v1/jobs/{job_id}/artifacts").json()["data"] == [] and _stored(settings, job_id) == []


def test_a_worker_taken_over_after_storing_its_artifacts_deletes_them(
    client: TestClient, settings: Settings, engine: Engine, job_id: str, context: WorkerContext,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_store = runner.store_artifacts
    stored: list[str] = []

    def store_then_lose(*args: Any, **kwargs: Any) -> Any:
        records = real_store(*args, **kwargs)
        stored.extend(r.storage_key for r in records)
        _take_over(engine, job_id)  # the lease ran out while the objects were uploading
        return records

    monkeypatch.setattr(runner, "store_artifacts", store_then_lose)
    assert execute_job(job_id=job_id, context=context, pipeline=run_pruning) is Outcome.skipped
    assert stored and _stored(settings, job_id) == []  # written, then removed
    with make_session_factory(engine)() as session:
        assert repository.list_artifacts(session, job_id=job_id) == []
        job = repository.get_job(session, job_id=job_id)
        assert job is not None and job.status == "running" and job.worker_id == "new-holder"
