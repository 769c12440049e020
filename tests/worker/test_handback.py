"""The time a running job still needs, a worker that is shutting down handing its job back, and a job's end.

The reporter's estimate from its own progress writes (a controlled clock); the shutdown flag file a
worker's main process leaves; the conditional hand-back in the database; and what a finished job
leaves of its resume state and in ``cahp_job_duration_seconds``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from app.core.db import Job, repository, transaction
from app.core.metrics import REGISTRY
from app.core.storage import open_store, resume_prefix
from tests.support.helpers import job_body
from tests.support.rows import Clock, job_row, running_job
from worker import shutdown
from worker.reporting import ETA_MIN_S, KEEP_ALIVE_CHECK_S, KEEP_ALIVE_S, JobReporter
from worker.resume_store import ArtifactResumeStore
from worker.runner import Outcome, WorkerContext, execute_job


def test_the_time_left_follows_the_measured_pace_once_there_is_one(sessions: sessionmaker[Session]) -> None:
    job_id, clock = running_job(sessions), Clock()
    reporter = JobReporter(sessions, job_id=job_id, worker_id="w", clock=clock, progress_interval_s=0.0,
                           cancel_check_interval_s=0.0, time_limit_s=10_000.0)
    reporter.progress("recovery", 0.20)
    assert job_row(sessions, job_id).eta_s is None  # nothing measured yet
    clock.now += ETA_MIN_S / 2
    reporter.progress("recovery", 0.25)
    assert job_row(sessions, job_id).eta_s is None  # too soon to tell
    clock.now += ETA_MIN_S
    reporter.progress("recovery", 0.30)  # 10 points in 1.5 x ETA_MIN_S: 70 points left take 7 times that
    assert job_row(sessions, job_id).eta_s == pytest.approx(7 * 1.5 * ETA_MIN_S)


def test_a_quiet_stage_still_gets_a_line_every_half_minute(sessions: sessionmaker[Session]) -> None:
    job_id, clock = running_job(sessions), Clock()
    reporter = JobReporter(sessions, job_id=job_id, worker_id="w", clock=clock, progress_interval_s=0.0,
                           cancel_check_interval_s=0.0, time_limit_s=10_000.0)
    reporter.progress("teacher", 0.3)
    reporter.log("teacher logits over 8544 rows")
    # Asked every KEEP_ALIVE_CHECK_S, it speaks one check before KEEP_ALIVE_S of quiet: never a longer silence.
    clock.now += KEEP_ALIVE_S - KEEP_ALIVE_CHECK_S - 1
    reporter.keep_alive()
    clock.now += 1
    reporter.keep_alive()
    reporter.keep_alive()  # said: quiet again from now
    with transaction(sessions) as session:
        lines = [line.message for line in repository.read_logs(session, job_id=job_id, offset=0, limit=10)]
    assert lines == ["teacher logits over 8544 rows",
                     "teacher: still working, 25 s into this stage (30% of the job done)"]
    reporter.drain()
    clock.now += 2 * KEEP_ALIVE_S
    reporter.keep_alive()  # the job's end is being recorded: nothing more
    with transaction(sessions) as session:
        assert len(repository.read_logs(session, job_id=job_id, offset=0, limit=10)) == 2


def test_a_shutdown_flag_stops_the_job_for_a_hand_back(sessions: sessionmaker[Session], tmp_path: Path) -> None:
    job_id, clock = running_job(sessions), Clock()
    reporter = JobReporter(sessions, job_id=job_id, worker_id="w", clock=clock, progress_interval_s=0.0,
                           cancel_check_interval_s=0.0, time_limit_s=10_000.0,
                           shutting_down=lambda: shutdown.requested(tmp_path))
    assert not reporter.should_cancel()
    shutdown.request(tmp_path)  # what the worker's main process does at SIGTERM (this process is its own main)
    assert shutdown.flag_path(tmp_path, os.getpid()).exists()
    assert reporter.should_cancel() and reporter.stop_reason == "shutdown"
    shutdown.clear(tmp_path)
    assert not shutdown.requested(tmp_path)


def test_a_hand_back_returns_the_attempt_and_queues_the_job_unless_it_was_cancelled(
        sessions: sessionmaker[Session]) -> None:
    job_id = running_job(sessions)
    with transaction(sessions) as session:
        assert not repository.hand_back_job(session, job_id=job_id, worker_id="someone else", messages=["x"])
        assert repository.hand_back_job(session, job_id=job_id, worker_id="w", messages=["handed back"])
    row = job_row(sessions, job_id)
    assert (row.status, row.attempts, row.worker_id, row.lease_expires_at) == ("queued", 0, None, None)
    assert row.enqueued_at is not None
    with transaction(sessions) as session:
        assert [line.message for line in repository.read_logs(session, job_id=job_id, offset=0, limit=10)] == [
            "handed back"]

    cancelled = running_job(sessions)
    with transaction(sessions) as session:
        session.execute(update(Job).where(Job.id == cancelled).values(cancel_requested=True))
    with transaction(sessions) as session:
        assert not repository.hand_back_job(session, job_id=cancelled, worker_id="w", messages=["x"])
    assert job_row(sessions, cancelled).status == "running"  # the worker ends it cancelled instead


def test_a_finished_job_keeps_no_resume_state_and_its_duration_is_observed(
    client: TestClient, auth: dict[str, str], context: WorkerContext, model_uri: str, dataset_uri: str,
    tmp_path: Path,
) -> None:
    job_id = client.post("/v1/jobs", json=job_body(model_uri, dataset_uri), headers=auth).json()["id"]
    # What an earlier attempt left: a saved stage this attempt finds (it was saved with other settings).
    saved = tmp_path / "stage"
    saved.mkdir()
    (saved / "stage.json").write_text('{"settings": {}}')
    ArtifactResumeStore(context.store, job_id=job_id, local=tmp_path / "local").save("selection", saved)
    store = open_store(context.settings)
    assert store.exists(f"{resume_prefix(job_id)}/index.json")
    before = REGISTRY.get_sample_value("cahp_job_duration_seconds_count", {"status": "succeeded"}) or 0.0

    assert execute_job(job_id=job_id, context=context) is Outcome.succeeded
    assert not store.exists(f"{resume_prefix(job_id)}/index.json")
    root = context.settings.data_dir / "artifacts" / "jobs" / job_id
    assert sorted(p.name for p in root.iterdir()) == ["1"]
    assert REGISTRY.get_sample_value("cahp_job_duration_seconds_count", {"status": "succeeded"}) == before + 1
    logs = client.get(f"/v1/jobs/{job_id}/logs", headers=auth).json()["data"]
    assert any("ignoring the checkpoints selection" in line["message"] for line in logs)


def test_a_handed_back_job_cancelled_while_queued_leaves_no_resume_state(
    client: TestClient, auth: dict[str, str], context: WorkerContext, sessions: sessionmaker[Session],
    dataset_uri: str, tmp_path: Path,
) -> None:
    job_id = client.post("/v1/jobs", json=job_body("hf://org/model", dataset_uri), headers=auth).json()["id"]
    with transaction(sessions) as session:
        assert repository.claim_job(session, job_id=job_id, worker_id="w") is not None
    saved = tmp_path / "stage"
    saved.mkdir()
    (saved / "stage.json").write_text("{}")
    ArtifactResumeStore(context.store, job_id=job_id, local=tmp_path / "local").save("selection", saved)
    with transaction(sessions) as session:
        assert repository.hand_back_job(session, job_id=job_id, worker_id="w", messages=["handed back"])
    store = open_store(context.settings)
    assert store.exists(f"{resume_prefix(job_id)}/index.json")  # kept for the next attempt
    assert client.post(f"/v1/jobs/{job_id}/cancel", headers=auth).json()["status"] == "cancelled"
    assert not store.exists(f"{resume_prefix(job_id)}/index.json")
