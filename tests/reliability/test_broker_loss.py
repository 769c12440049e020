"""A Redis without persistence is killed and restarted under queued jobs: no job is lost.

The broker is a ``redis-server`` of this test's own, so killing it disturbs no other test. The API
is a real ``cahp serve``; its sweeper re-sends queued jobs whose messages are gone, periodically
while it runs and once at start-up.
"""

from __future__ import annotations

from pathlib import Path

import httpx
from sqlalchemy import text

from app.api.background import JobQueue, sweep_once, waiting_job_ids
from app.core.db import make_session_factory
from app.core.storage import open_store
from tests.support.helpers import (
    job_body,
    migrated_engine,
    new_key,
    service_settings,
    write_tiny_dataset,
    write_tiny_model,
)
from tests.support.processes import stop, wait_for
from tests.support.stack import FAST_RECOVERY, TERMINAL, PrivateRedis, Server, settings_env, start, start_server


def test_queued_jobs_outlive_a_broker_restart_and_an_api_restart(tmp_path: Path, private_redis: PrivateRedis) -> None:
    settings = service_settings(tmp_path, broker_url=private_redis.url, queue="jobs", **FAST_RECOVERY)
    engine = migrated_engine(settings)
    key = new_key(engine, "ci")
    local = settings.allowed_local_roots[0]
    body = job_body(f"file://{write_tiny_model(local / 'model')}", f"file://{write_tiny_dataset(local / 'data')}")

    def waiting() -> set[str]:
        return waiting_job_ids(private_redis.url, settings.queue) or set()

    def submit(server: Server) -> str:
        response = httpx.post(f"{server.url}/v1/jobs", json=body, headers={"Authorization": f"Bearer {key}"},
                              timeout=60)
        assert response.status_code == 202, response.text
        assert response.json()["status"] == "queued"
        return str(response.json()["id"])

    api = start_server(settings, tmp_path / "api-1.log")
    try:
        jobs = {submit(api) for _ in range(3)}
        assert waiting() == jobs and private_redis.length(settings.queue) == 3

        private_redis.kill()  # every message is gone with it
        late = submit(api)  # accepted while the broker is down, and kept queued
        jobs.add(late)
        private_redis.start()
        # The running API's sweeper sends each lost or never-sent job again, once.
        wait_for(lambda: waiting() == jobs, timeout=60, what="the sweeper to re-send the jobs", log=api.log)
        queue = JobQueue(settings)
        try:
            again = sweep_once(sessions=make_session_factory(engine), queue=queue, store=open_store(settings),
                               settings=settings)
        finally:
            queue.close()
        assert again.sent == () and private_redis.length(settings.queue) == len(jobs)
    finally:
        stop(api.process)

    # While the API is down, Redis restarts again; the API's start-up sweep sends the jobs again.
    private_redis.kill()
    private_redis.start()
    assert waiting() == set()
    api = start_server(settings, tmp_path / "api-2.log", sweep_interval_s=3600.0)  # only the start-up sweep
    try:
        wait_for(lambda: waiting() == jobs, timeout=60, what="the start-up sweep to re-send the jobs", log=api.log)
        assert private_redis.length(settings.queue) == len(jobs)
        worker = start(["worker", "--pool", "solo"], settings_env(settings), tmp_path / "worker.log")
        try:
            with httpx.Client(base_url=api.url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
                def all_done() -> bool:
                    return all(http.get(f"/v1/jobs/{job}").json()["status"] in TERMINAL for job in jobs)

                wait_for(all_done, timeout=300, what="the worker to run every job", log=tmp_path / "worker.log")
                for job in jobs:
                    assert http.get(f"/v1/jobs/{job}").json()["status"] == "succeeded"
        finally:
            stop(worker)
    finally:
        stop(api.process)
    with engine.connect() as connection:
        # Each job ran exactly once, however many messages it had.
        attempts = connection.execute(text("SELECT attempts FROM jobs")).scalars().all()
    assert sorted(attempts) == [1] * len(jobs)
    engine.dispose()
