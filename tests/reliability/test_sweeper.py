"""One sweep at a time (:func:`app.api.background._sweeper.sweep_once`), against the embedded broker and a real store,
with the job database on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text, update
from sqlalchemy.orm import Session, sessionmaker

from app.api.background import JobQueue, SweepReport, job_id_of, sweep_once, waiting_job_ids
from app.api.main import create_app
from app.core.db import Job, Upload, make_session_factory, repository, transaction, utcnow
from app.core.settings import Settings
from app.core.storage import ArtifactStore, open_store
from tests.support.helpers import free_port, job_body, migrated_engine, new_key, postgres_schema_url, service_settings


@dataclass
class Rig:
    settings: Settings
    sessions: sessionmaker[Session]
    store: ArtifactStore
    client: TestClient

    def sweep(self, **overrides: object) -> SweepReport:
        settings = self.settings.model_copy(update=overrides)
        queue = JobQueue(settings)
        try:
            return sweep_once(sessions=self.sessions, queue=queue, store=self.store, settings=settings)
        finally:
            queue.close()

    def submit(self) -> str:
        response = self.client.post("/v1/jobs", json=job_body("hf://org/model", "hf://datasets/org/data"))
        assert response.status_code == 202, response.text
        return str(response.json()["id"])

    def waiting(self) -> set[str]:
        return waiting_job_ids(self.settings.resolved_broker_url, self.settings.queue) or set()


@pytest.fixture(params=["sqlite", "postgresql"])
def rig(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Rig]:
    def build(settings: Settings) -> Iterator[Rig]:
        engine = migrated_engine(settings)
        key = new_key(engine)
        with TestClient(create_app(settings), headers={"Authorization": f"Bearer {key}"}) as client:
            yield Rig(settings=settings, sessions=make_session_factory(engine), store=open_store(settings),
                      client=client)
        engine.dispose()

    base = {"requeue_after_s": 0.0, "upload_stale_s": 60.0}
    if request.param == "sqlite":
        yield from build(service_settings(tmp_path, **base))
        return
    with postgres_schema_url() as url:
        yield from build(service_settings(tmp_path, database_url=url, **base))


def _drop_message(settings: Settings, job_id: str, *, taken: bool = False) -> None:
    """Lose a job's message the way a purged queue or a broker without persistence does; with
    ``taken``, leave it as the embedded broker does once a worker has received it."""
    broker = create_engine(settings.resolved_broker_url.split("+", 1)[1])
    change = "UPDATE kombu_message SET visible = 0" if taken else "DELETE FROM kombu_message"
    with broker.begin() as connection:
        for message_id, payload in connection.execute(text("SELECT id, payload FROM kombu_message")).all():
            if job_id_of(payload) == job_id:
                connection.execute(text(f"{change} WHERE id = :id"), {"id": message_id})
    broker.dispose()


def test_a_queued_job_whose_message_is_lost_is_sent_again_once(rig: Rig) -> None:
    kept, lost = rig.submit(), rig.submit()
    _drop_message(rig.settings, lost)
    assert rig.waiting() == {kept}
    assert rig.sweep(requeue_after_s=3600.0).sent == ()  # sent too recently: it may still be on its way
    assert rig.sweep().sent == (lost,)
    assert rig.waiting() == {kept, lost}
    assert rig.sweep() == SweepReport()  # every queued job has its message: nothing to do


def test_a_job_whose_worker_is_gone_is_queued_again_and_sent(rig: Rig) -> None:
    job_id = rig.submit()
    _drop_message(rig.settings, job_id, taken=True)  # the worker received it, then died
    with transaction(rig.sessions) as session:
        repository.claim_job(session, job_id=job_id, worker_id="dead-worker", lease_s=60)
        session.execute(update(Job).where(Job.id == job_id).values(lease_expires_at=utcnow() - dt.timedelta(seconds=1)))
    report = rig.sweep()
    assert report.requeued == (job_id,) and report.sent == (job_id,)
    job = rig.client.get(f"/v1/jobs/{job_id}").json()
    assert job["status"] == "queued" and job["stage"] is None and job["progress"] == 0.0
    logs = rig.client.get(f"/v1/jobs/{job_id}/logs").json()["data"]
    assert "dead-worker stopped renewing its lease during attempt 1" in logs[-1]["message"]
    with rig.sessions() as session:
        assert repository.claim_job(session, job_id=job_id, worker_id="w2") is not None


def test_uploads_left_incomplete_by_a_crash_are_removed_with_their_objects_and_partial_files(rig: Rig) -> None:
    settings, store = rig.settings, rig.store
    source = settings.data_dir / "source.csv"
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_text("text,label\nfine,1\n")
    complete = rig.client.post("/v1/uploads", files={"file": ("train.csv", source.read_bytes())}).json()
    owner = rig.client.get("/v1/jobs").request.headers["authorization"].split("_")[1]
    old = utcnow() - dt.timedelta(hours=2)

    def incomplete(upload_id: str, created: dt.datetime) -> str:
        key = f"uploads/{upload_id}.csv"
        store.put_file(key, source, media_type="text/csv")  # stored, but the API died before completing it
        with transaction(rig.sessions) as session:
            repository.add_upload(session, Upload(id=upload_id, owner_id=owner, kind="data", filename="x.csv",
                                                  suffix=".csv", media_type="text/csv", size=20, sha256="0" * 64,
                                                  storage_key=key, created_at=created))
        return key

    abandoned, in_progress = "a" * 32, "b" * 32
    abandoned_key, in_progress_key = incomplete(abandoned, old), incomplete(in_progress, utcnow())
    settings.spool_dir.mkdir(parents=True, exist_ok=True)
    stale_spool, fresh_spool = settings.spool_dir / f"{'c' * 32}.csv", settings.spool_dir / f"{'d' * 32}.csv"
    stale_spool.write_text("partial"), fresh_spool.write_text("arriving")
    os.utime(stale_spool, (time.time() - 7200, time.time() - 7200))

    report = rig.sweep()
    assert report.uploads_removed == (abandoned,) and report.spool_files_removed == 1
    assert not store.exists(abandoned_key) and not stale_spool.exists()
    assert store.exists(in_progress_key) and fresh_spool.exists()  # still within CAHP_UPLOAD_STALE_S
    with rig.sessions() as session:
        assert session.get(Upload, abandoned) is None and session.get(Upload, in_progress) is not None
        assert repository.get_upload(session, upload_id=complete["id"], owner_id=owner) is not None
    assert store.exists(f"uploads/{complete['id']}.csv")


def test_a_sweep_with_the_broker_down_sends_nothing_and_keeps_the_jobs(tmp_path: Path) -> None:
    settings = service_settings(tmp_path, broker_url=f"redis://127.0.0.1:{free_port()}/0", requeue_after_s=0.0)
    engine = migrated_engine(settings)
    key = new_key(engine)
    with TestClient(create_app(settings), headers={"Authorization": f"Bearer {key}"}) as client:
        job_id = client.post("/v1/jobs", json=job_body("hf://org/model", "hf://datasets/org/data")).json()["id"]
        queue = JobQueue(settings)
        try:
            report = sweep_once(sessions=make_session_factory(engine), queue=queue, store=open_store(settings),
                                settings=settings)
        finally:
            queue.close()
        assert report.sent == ()
        assert client.get(f"/v1/jobs/{job_id}").json()["status"] == "queued"
    engine.dispose()


def test_no_eta_is_shown_while_no_live_worker_holds_the_job_only_why(rig: Rig) -> None:
    job_id = rig.submit()
    queued = rig.client.get(f"/v1/jobs/{job_id}").json()
    assert queued["eta_s"] is None and queued["eta_reason"].startswith("queued: waiting for a worker")
    with transaction(rig.sessions) as session:
        repository.claim_job(session, job_id=job_id, worker_id="w1", lease_s=60)
        repository.report_progress(session, job_id=job_id, worker_id="w1", stage="recovery", progress=0.5, eta_s=72.0)
    held = rig.client.get(f"/v1/jobs/{job_id}").json()
    assert held["eta_s"] == 72.0 and held["eta_reason"] is None
    # The worker died: its lease lapses before any sweep. The last figure is not shown frozen.
    with transaction(rig.sessions) as session:
        session.execute(update(Job).where(Job.id == job_id).values(lease_expires_at=utcnow() - dt.timedelta(seconds=1)))
    lost = rig.client.get(f"/v1/jobs/{job_id}").json()
    assert lost["status"] == "running" and lost["eta_s"] is None and "stopped renewing its lease" in lost["eta_reason"]
    rig.sweep()
    again = rig.client.get(f"/v1/jobs/{job_id}").json()
    assert again["status"] == "queued" and again["eta_s"] is None
    assert "resumes from its checkpoints" in again["eta_reason"]
    assert again["progress"] == 0.5  # and the progress shown does not go back
