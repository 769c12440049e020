"""A real Celery worker process on the real Redis: a job from upload to loaded checkpoint, and a cancel."""

from __future__ import annotations

import hashlib
import tarfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from app.api.main import create_app
from app.core.settings import Settings
from cahp_engine import load_pruned
from cahp_engine.run import ARTIFACT_FILES
from tests.support.helpers import (
    job_body,
    migrated_engine,
    new_key,
    service_settings,
    tar_directory,
    write_tiny_dataset,
    write_tiny_model,
)
from tests.support.processes import child_env, poll_job, start, stop, wait_for


@dataclass
class Deployment:
    client: TestClient
    settings: Settings
    worker_log: Path
    root: Path


@pytest.fixture(scope="module")
def deployment(redis_available: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    root = tmp_path_factory.mktemp("redis-e2e")
    # A queue of this run's own, so parallel runs on the same Redis never take each other's jobs.
    queue = f"cahp-e2e-{uuid.uuid4().hex[:10]}"
    settings = service_settings(root, broker_url=redis_available, queue=queue, progress_interval_s=0.2,
                                cancel_check_interval_s=0.2)
    engine = migrated_engine(settings)
    key = new_key(engine, "e2e")
    log = root / "worker.log"
    env = child_env(**{k[len("CAHP_"):].lower(): v for k, v in settings.child_environment().items()})
    worker = start(["worker", "--pool", "solo", "--log-level", "info"], env, log)
    try:
        wait_for(lambda: "ready." in log.read_text(errors="replace"), timeout=90, what="the worker", log=log)
        with TestClient(create_app(settings), headers={"Authorization": f"Bearer {key}"}) as client:
            yield Deployment(client=client, settings=settings, worker_log=log, root=root)
    finally:
        stop(worker)
        engine.dispose()
        redis.Redis.from_url(redis_available).delete(queue)


def _upload(client: TestClient, path: Path) -> str:
    with open(path, "rb") as handle:
        response = client.post("/v1/uploads", files={"file": (path.name, handle)})
    # 200 for bytes this key uploaded before (another test of the module): the same upload again.
    assert response.status_code in (200, 201), response.text
    return str(response.json()["uri"])


def _inputs(deployment: Deployment) -> tuple[str, str]:
    root = deployment.root
    if not (root / "model.tar.gz").exists():
        tar_directory(write_tiny_model(root / "src" / "model"), root / "model.tar.gz")
        tar_directory(write_tiny_dataset(root / "src" / "dataset"), root / "dataset.tar.gz")
    return _upload(deployment.client, root / "model.tar.gz"), _upload(deployment.client, root / "dataset.tar.gz")


def test_a_job_runs_on_the_worker_and_every_artifact_downloads_intact(deployment: Deployment, tmp_path: Path) -> None:
    client = deployment.client
    model_uri, dataset_uri = _inputs(deployment)
    submitted = client.post("/v1/jobs", json=job_body(model_uri, dataset_uri))
    assert submitted.status_code == 202, submitted.text
    job = poll_job(client, submitted.json()["id"], lambda j: j["status"] in ("succeeded", "failed", "cancelled"),
                   timeout=180, log=deployment.worker_log)
    assert job["status"] == "succeeded", job
    assert job["result"]["heads_total"] == 8 and job["result"]["k_star"] is not None
    manifest: list[dict[str, Any]] = client.get(f"/v1/jobs/{job['id']}/artifacts").json()["data"]
    assert {a["name"] for a in manifest} == {"model.tar.gz", *ARTIFACT_FILES}
    for entry in manifest:
        body = client.get(entry["url"]).content
        assert hashlib.sha256(body).hexdigest() == entry["sha256"], entry["name"]
        (tmp_path / entry["name"]).write_bytes(body)
    with tarfile.open(tmp_path / "model.tar.gz") as tar:
        tar.extractall(tmp_path / "checkpoint", filter="data")
    model = load_pruned(tmp_path / "checkpoint" / "model")
    kept = job["result"]["heads_kept"]
    assert sum(layer.attention.self.num_attention_heads for layer in model.bert.encoder.layer) == kept
    logs = client.get(f"/v1/jobs/{job['id']}/logs").json()["data"]
    assert logs and logs[0]["message"].startswith("attempt 1 on worker")


def test_a_running_job_is_cancelled_and_the_worker_takes_the_next_job(deployment: Deployment) -> None:
    client = deployment.client
    model_uri, dataset_uri = _inputs(deployment)
    # Long enough that it is still fine-tuning when the cancel arrives: 1000 epochs of 30 steps.
    slow = client.post("/v1/jobs", json=job_body(model_uri, dataset_uri, epochs=1000, batch_size=2)).json()
    poll_job(client, slow["id"], lambda j: j["stage"] == "recovery" or j["status"] != "running" and
             j["status"] != "queued", timeout=120, log=deployment.worker_log)
    cancel = client.post(f"/v1/jobs/{slow['id']}/cancel")
    assert cancel.status_code == 202 and cancel.json()["cancel_requested"]
    job = poll_job(client, slow["id"], lambda j: j["status"] != "running", timeout=60, log=deployment.worker_log)
    assert job["status"] == "cancelled" and job["error"]["code"] == "cancelled", job
    assert client.get(f"/v1/jobs/{slow['id']}/artifacts").json()["data"] == []
    # The worker is free again: a small job goes through.
    quick = client.post("/v1/jobs", json=job_body(model_uri, dataset_uri)).json()
    done = poll_job(client, quick["id"], lambda j: j["status"] not in ("queued", "running"), timeout=120,
                    log=deployment.worker_log)
    assert done["status"] == "succeeded", done
