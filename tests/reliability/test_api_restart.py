"""``cahp serve`` killed with SIGKILL and started again: jobs, logs, artifacts and uploads survive.

Embedded mode (SQLite database, SQLite broker, local artifacts), with an upload in flight at the
moment of the kill. Jobs are run by the worker's own code in this process, against the same
database and store, so the test controls which job is in which state when the API dies.
"""

from __future__ import annotations

import hashlib
import socket
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text

from app.api.background import waiting_job_ids
from app.core.db import make_session_factory
from app.core.storage import open_store
from tests.support import jobs as jobs_support
from tests.support.helpers import (
    TINY_PARAMS,
    migrated_engine,
    new_key,
    service_settings,
    tar_directory,
    write_split,
    write_tiny_dataset,
    write_tiny_model,
)
from tests.support.processes import stop, wait_for
from tests.support.stack import Server, start_server
from worker.runner import Outcome, WorkerContext, execute_job


def _snapshot(http: httpx.Client, job_ids: list[str]) -> dict[str, Any]:
    """What a client can read about each job: the job, its log, its manifest and artifact bytes.

    Signed links are made afresh on every read (their expiry counts from it): the manifest is kept
    without them, and what each downloads is kept instead.
    """
    seen: dict[str, Any] = {}
    for job_id in job_ids:
        manifest = http.get(f"/v1/jobs/{job_id}/artifacts").json()["data"]
        signed = {a["name"]: hashlib.sha256(http.get(a["signed_url"]).content).hexdigest()
                  for a in manifest if a.get("signed_url")}
        seen[job_id] = {
            "job": http.get(f"/v1/jobs/{job_id}").json(),
            "logs": http.get(f"/v1/jobs/{job_id}/logs").json(),
            "manifest": [{k: v for k, v in a.items() if not k.startswith("signed_url")} for a in manifest],
            "bytes": {a["name"]: hashlib.sha256(http.get(a["url"]).content).hexdigest() for a in manifest},
            "signed_bytes": signed,
        }
    seen["list"] = http.get("/v1/jobs", params={"limit": 100}).json()
    return seen


def _start_partial_upload(server: Server, key: str, size: int) -> socket.socket:
    """Send the headers and a third of a multipart upload, and leave the rest unsent."""
    boundary = "cahp-test-boundary"
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"train.csv\"\r\n"
            "Content-Type: text/csv\r\n\r\n").encode()
    tail = f"\r\n--{boundary}--\r\n".encode()
    port = int(server.url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    request = (f"POST /v1/uploads HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n"
               f"Content-Type: multipart/form-data; boundary={boundary}\r\n"
               f"Content-Length: {len(head) + size + len(tail)}\r\n\r\n").encode()
    sock.sendall(request + head + b"text,label\n" + b"x" * (size // 3))
    return sock


def test_everything_recorded_survives_a_killed_api_and_an_interrupted_upload_leaves_nothing(tmp_path: Path) -> None:
    settings = service_settings(tmp_path, max_upload_bytes=4 * 1024 * 1024, upload_stale_s=1.0)
    engine = migrated_engine(settings)
    key = new_key(engine, "restart")
    sources = tmp_path / "sources"
    model_archive = tar_directory(write_tiny_model(sources / "model"), tmp_path / "model.tar.gz")
    data_archive = tar_directory(write_tiny_dataset(sources / "data"), tmp_path / "data.tar.gz")
    bad = sources / "bad"
    for split, n in (("train", 20), ("test", 10)):
        path = write_split(bad / f"{split}.csv", n, seed=4)
        path.write_text(path.read_text().replace("text,label", "text,category"))
    bad_archive = tar_directory(bad, tmp_path / "bad.tar.gz")
    worker = WorkerContext(settings=settings, sessions=make_session_factory(engine), store=open_store(settings),
                           worker_id="in-test-worker")

    api = start_server(settings, tmp_path / "api-1.log")
    with httpx.Client(base_url=api.url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
        def upload(path: Path) -> str:
            with open(path, "rb") as handle:
                response = http.post("/v1/uploads", files={"file": (path.name, handle)})
            assert response.status_code == 201, response.text
            return str(response.json()["uri"])

        model, data, bad_data = upload(model_archive), upload(data_archive), upload(bad_archive)

        def submit(dataset: str) -> str:
            body = {"model": {"uri": model}, "dataset": {"uri": dataset}, "params": TINY_PARAMS}
            response = http.post("/v1/jobs", json=body)
            assert response.status_code == 202, response.text
            return str(response.json()["id"])

        succeeded, cancelled, queued = submit(data), submit(data), submit(data)
        # Submit refuses the bad dataset now (the preflight); a job that fails in the worker is recorded
        # as one was before it, so that a failed job is among those that must survive the restart.
        failed = jobs_support.record(engine, {"model": {"uri": model}, "dataset": {"uri": bad_data},
                                              "params": TINY_PARAMS}, key_name="restart")
        assert execute_job(job_id=succeeded, context=worker) is Outcome.succeeded
        assert execute_job(job_id=failed, context=worker) is Outcome.failed
        assert http.post(f"/v1/jobs/{cancelled}/cancel").json()["status"] == "cancelled"
        jobs = [succeeded, failed, cancelled, queued]
        before = _snapshot(http, jobs)
    assert before[succeeded]["manifest"] and before[failed]["job"]["error"]["code"] == "invalid_dataset"
    with engine.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM uploads")).scalar_one() == 3
    waiting_before = waiting_job_ids(settings.resolved_broker_url, settings.queue)

    in_flight = _start_partial_upload(api, key, size=3 * 1024 * 1024)
    try:
        api.process.kill()  # SIGKILL: no shutdown code runs
        api.process.wait()
    finally:
        in_flight.close()

    # requeue_after_s=0: the start-up sweep considers every queued job, and must find their messages.
    api = start_server(settings, tmp_path / "api-2.log", sweep_interval_s=0.5, requeue_after_s=0.0)
    try:
        with httpx.Client(base_url=api.url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
            assert _snapshot(http, jobs) == before
            # The queued job still has its one message in the embedded broker, and nothing was sent twice.
            assert waiting_job_ids(settings.resolved_broker_url, settings.queue) == waiting_before
            assert queued in waiting_before
            # The interrupted upload left no row, no stored object and no partial file.
            with engine.connect() as connection:
                rows = connection.execute(text("SELECT id, completed_at FROM uploads")).all()
            assert len(rows) == 3 and all(row.completed_at is not None for row in rows)
            stored = sorted(p.name for p in (settings.data_dir / "artifacts" / "uploads").iterdir())
            assert stored == sorted(f"{row.id}.tar.gz" for row in rows)
            wait_for(lambda: not any(settings.spool_dir.iterdir()) if settings.spool_dir.exists() else True,
                     timeout=30, what="the spool directory to be empty", log=api.log)
            # And the uploads made before the crash still work.
            again = http.post("/v1/jobs", json={"model": {"uri": model}, "dataset": {"uri": data},
                                                "params": TINY_PARAMS})
            assert again.status_code == 202, again.text
            assert execute_job(job_id=again.json()["id"], context=worker) is Outcome.succeeded
    finally:
        stop(api.process)
    engine.dispose()
