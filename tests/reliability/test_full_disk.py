"""A full disk is the server's problem: 507 ``insufficient_storage``, and nothing left half-stored.

Each test mounts a small real tmpfs where the service writes (the upload spool, the artifact store),
so the ``ENOSPC`` comes from a real filesystem. Mounting needs root (CI runs as root); elsewhere the
tests are skipped with the reason.
"""

from __future__ import annotations

import subprocess
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from app.api.main import create_app
from app.core.db import make_session_factory
from app.core.settings import Settings
from app.core.storage import open_store
from cahp_engine.run import RunHooks, RunReport, RunRequest, run_pruning
from tests.support.helpers import job_body, new_key, service_settings, write_tiny_dataset, write_tiny_model
from worker.runner import Outcome, WorkerContext, execute_job


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return service_settings(tmp_path, max_upload_bytes=8 * 1024 * 1024)


def _mount_small(path: Path, size: str) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", f"cahp-test-{uuid.uuid4().hex[:6]}",
                              str(path)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({mounted.stderr.strip()}); CI runs as root and can")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture
def small_spool(settings: Settings) -> Iterator[Path]:
    yield from _mount_small(settings.spool_dir, "256k")


@pytest.fixture
def small_store(settings: Settings) -> Iterator[Path]:
    yield from _mount_small(Path(settings.resolved_artifact_store), "4m")


def test_an_upload_that_fills_the_disk_is_a_507_and_leaves_nothing(
    settings: Settings, engine: Engine, small_spool: Path
) -> None:
    with TestClient(create_app(settings), headers={"Authorization": f"Bearer {new_key(engine)}"}) as client:
        payload = b"text,label\n" + b"a fine film,1\n" * 80_000  # ~1.1 MB into 256 KiB
        response = client.post("/v1/uploads", files={"file": ("train.csv", payload)})
        assert response.status_code == 507, response.text
        body = response.json()
        assert body["code"] == "insufficient_storage" and "disk space" in body["detail"]
        assert str(settings.data_dir) not in body["detail"]
        # Small uploads still go through once there is room: the partial file was removed.
        assert client.post("/v1/uploads", files={"file": ("train.csv", b"text,label\nok,1\n")}).status_code == 201
    assert list(small_spool.iterdir()) == []
    with engine.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM uploads")).scalar_one() == 1


def _fill(directory: Path, leave: int) -> None:
    """Write filler into ``directory`` until about ``leave`` bytes are free."""
    import os

    stats = os.statvfs(directory)
    free = stats.f_bavail * stats.f_frsize
    with open(directory / ".filler", "wb") as handle:
        handle.write(b"\0" * max(0, free - leave))


def test_a_store_that_fills_mid_way_fails_the_job_as_insufficient_storage_and_leaves_no_objects(
    settings: Settings, engine: Engine, small_store: Path, tmp_path: Path
) -> None:
    local = settings.allowed_local_roots[0]
    with TestClient(create_app(settings), headers={"Authorization": f"Bearer {new_key(engine)}"}) as client:
        job_id = client.post("/v1/jobs", json=job_body(f"file://{write_tiny_model(local / 'm')}",
                                                       f"file://{write_tiny_dataset(local / 'd')}")).json()["id"]

        def run_then_fill(request: RunRequest, hooks: RunHooks) -> RunReport:
            # The real run; then the store's disk is filled so that model.tar.gz (stored first) fits
            # and the next artifact does not.
            report = run_pruning(request, hooks)
            probe = tmp_path / "probe.tar.gz"
            with tarfile.open(probe, "w:gz") as tar:
                tar.add(Path(request.output_dir) / "model", arcname="model")
            _fill(small_store, probe.stat().st_size + 16 * 1024)
            return report

        context = WorkerContext(settings=settings, sessions=make_session_factory(engine),
                                store=open_store(settings), worker_id="full-disk")
        assert execute_job(job_id=job_id, context=context, pipeline=run_then_fill) is Outcome.failed
        job = client.get(f"/v1/jobs/{job_id}").json()
        assert job["error"]["code"] == "insufficient_storage", job["error"]
        assert client.get(f"/v1/jobs/{job_id}/artifacts").json()["data"] == []
    stored = [p for p in small_store.rglob("*") if p.is_file() and p.name != ".filler"]
    assert stored == []
