"""Real failures on real processes: workers killed, messages delivered twice, brokers restarted.

A :class:`Stack` is one deployment for a test module: a SQLite job database and an artifact
directory under a temporary directory, the API in this process (``TestClient``, with its sweeper
thread when asked for), Celery workers as separate ``cahp worker`` processes, and the real Redis on
127.0.0.1:6379 with a queue of the stack's own (so no other test's worker takes its jobs).
Timings are short (a lease of a few seconds) so that a lost worker is noticed quickly.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker

from app.api.main import create_app
from app.core.db import Job, make_session_factory
from app.core.settings import Settings
from app.core.storage import open_store
from tests.support.helpers import (
    free_port,
    job_body,
    migrated_engine,
    new_key,
    service_settings,
    write_tiny_dataset,
    write_tiny_model,
)
from tests.support.processes import child_env, start, stop, wait_for
from worker.runner import WorkerContext

#: Settings that make a lost worker visible within seconds (see docs/operations.md for production).
FAST_RECOVERY: dict[str, Any] = {"lease_s": 4.0, "heartbeat_interval_s": 0.5, "sweep_interval_s": 0.5,
                                 "requeue_after_s": 1.0, "progress_interval_s": 0.2, "cancel_check_interval_s": 0.2}
#: Recovery epochs that keep a tiny job fine-tuning for several seconds (30 steps per epoch).
SLOW_EPOCHS = 60
TERMINAL = ("succeeded", "failed", "cancelled")


@dataclass
class Worker:
    process: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@dataclass
class Stack:
    root: Path
    settings: Settings
    engine: Engine
    client: TestClient
    workers: list[Worker] = field(default_factory=list)

    @property
    def sessions(self) -> sessionmaker[Session]:
        return make_session_factory(self.engine)

    def context(self, worker_id: str) -> WorkerContext:
        """What a worker process builds, for running worker logic in this process."""
        return WorkerContext(settings=self.settings, sessions=self.sessions, store=open_store(self.settings),
                             worker_id=worker_id)

    def start_worker(self, name: str, *, pool: str = "solo") -> Worker:
        env = child_env(**{k[len("CAHP_"):].lower(): v for k, v in self.settings.child_environment().items()})
        log = self.root / f"{name}.log"
        worker = Worker(start(["worker", "--pool", pool, "--name", f"{name}@%h", "--log-level", "info"], env, log),
                        log)
        self.workers.append(worker)
        return worker

    def wait_ready(self, *workers: Worker) -> None:
        for worker in workers:
            wait_for(lambda w=worker: "ready." in w.output(), timeout=120, what=f"worker {worker.log.stem}",
                     log=worker.log)

    def inputs(self) -> tuple[str, str]:
        local = self.settings.allowed_local_roots[0]
        if not (local / "model").exists():
            write_tiny_model(local / "model")
            write_tiny_dataset(local / "data")
        return f"file://{local / 'model'}", f"file://{local / 'data'}"

    def submit(self, **params: Any) -> str:
        model, data = self.inputs()
        response = self.client.post("/v1/jobs", json=job_body(model, data, **params))
        assert response.status_code == 202, response.text
        return str(response.json()["id"])

    def row(self, job_id: str) -> dict[str, Any]:
        """The job's row, read straight from the database (times as aware datetimes)."""
        with self.sessions() as session:
            job = session.get(Job, job_id)
            assert job is not None, job_id
            return {column.key: getattr(job, column.key) for column in Job.__table__.columns}

    def wait_row(self, job_id: str, until: Callable[[dict[str, Any]], bool], *, timeout: float, what: str) -> dict:
        seen: dict[str, Any] = {}

        def check() -> bool:
            nonlocal seen
            seen = self.row(job_id)
            return until(seen)

        logs = "\n".join(f"--- {w.log.name} ---\n{w.output()[-3000:]}" for w in self.workers)
        try:
            wait_for(check, timeout=timeout, what=what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nlast row: {seen}\n{logs}") from None
        return seen

    def logs(self, job_id: str) -> list[tuple[int, str]]:
        with self.engine.connect() as connection:
            rows = connection.execute(text("SELECT line, message FROM job_logs WHERE job_id = :id ORDER BY line"),
                                      {"id": job_id}).all()
        return [(row.line, row.message) for row in rows]

    def artifact_keys(self, job_id: str) -> list[str]:
        with self.engine.connect() as connection:
            rows = connection.execute(text("SELECT storage_key FROM artifacts WHERE job_id = :id"),
                                      {"id": job_id}).scalars()
            return sorted(rows)


def holder_pid(row: dict[str, Any]) -> int:
    """The pid of the process holding a running job (worker ids read ``host:pid:random``)."""
    return int(str(row["worker_id"]).rsplit(":", 2)[1])


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def stack(redis_available: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
          ) -> Iterator[Stack]:
    """A deployment on the real Redis; the module may set ``STACK_SETTINGS`` to override settings."""
    root = tmp_path_factory.mktemp("reliability")
    queue = f"cahp-rel-{uuid.uuid4().hex[:10]}"
    overrides = {**FAST_RECOVERY, **getattr(request.module, "STACK_SETTINGS", {})}
    settings = service_settings(root, broker_url=redis_available, queue=queue, **overrides)
    engine = migrated_engine(settings)
    key = new_key(engine, "reliability")
    with TestClient(create_app(settings), headers={"Authorization": f"Bearer {key}"}) as client:
        deployment = Stack(root=root, settings=settings, engine=engine, client=client)
        try:
            yield deployment
        finally:
            for worker in deployment.workers:
                stop(worker.process, grace_s=10)
    engine.dispose()
    purge_queue(redis_available, queue)


def purge_queue(redis_url: str, queue: str) -> None:
    """Delete a test queue and the unacknowledged messages killed workers left for it.

    Those would otherwise sit in the shared Redis until their visibility timeout ran out.
    """
    import json

    client = redis.Redis.from_url(redis_url)
    try:
        client.delete(queue)
        for tag, raw in client.hgetall("unacked").items():
            try:
                routing_key = json.loads(raw)[2]
            except (ValueError, IndexError, TypeError):
                continue
            if routing_key == queue:
                client.hdel("unacked", tag)
                client.zrem("unacked_index", tag)
    finally:
        client.close()


class PrivateRedis:
    """A ``redis-server`` of this test's own, without persistence, that can be killed and restarted.

    Killing it loses every message, as restarting a Redis without persistence does, and touches
    no other test's broker.
    """

    def __init__(self, directory: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed; install it (see .ci/run) to run broker-restart tests")
        self.binary = binary
        self.directory = directory
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(self.directory)]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self.answers, timeout=30, what=f"redis-server on port {self.port}")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def answers(self) -> bool:
        client = redis.Redis.from_url(self.url, socket_connect_timeout=1)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def length(self, key: str) -> int:
        client = redis.Redis.from_url(self.url)
        try:
            return int(client.llen(key))
        finally:
            client.close()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.kill()


def settings_env(settings: Settings) -> dict[str, str]:
    """Every setting as the ``CAHP_*`` variable a ``cahp serve`` or ``cahp worker`` process reads."""
    env: dict[str, str] = {}
    for name in Settings.model_fields:
        value = getattr(settings, name)
        if value is None:
            continue
        if name == "allowed_local_roots":
            value = os.pathsep.join(str(v) for v in value)
        elif isinstance(value, tuple):
            value = ",".join(str(v) for v in value)
        elif hasattr(value, "get_secret_value"):
            value = value.get_secret_value()
        env[name] = str(value).lower() if isinstance(value, bool) else str(value)
    return child_env(**env)


@dataclass
class Server:
    """A ``cahp serve`` process on a free loopback port."""

    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def ready(self) -> bool:
        import httpx

        try:
            return httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False


def start_server(settings: Settings, log: Path, *, workers: int = 0, **overrides: Any) -> Server:
    port = free_port()
    env = settings_env(settings.model_copy(update=overrides))
    process = start(["serve", "--port", str(port), "--workers", str(workers), "--log-level", "warning"], env, log)
    server = Server(process=process, url=f"http://127.0.0.1:{port}", log=log)
    wait_for(server.ready, timeout=120, what="cahp serve to answer", log=log)
    return server
