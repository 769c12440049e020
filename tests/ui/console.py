"""Builders for the console's browser tests: a live server, jobs in known states, and a browser.

Everything is real: the app from :func:`app.api.main.create_app` served by uvicorn on a free loopback
port, jobs submitted through the HTTP API and run by the worker's own ``execute_job`` on tiny random
models, and Debian's Chromium driven by Playwright. Also used by ``python -m tests.ui.screenshot``.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI
from sqlalchemy import Engine

from app.api.main import create_app
from app.core.db import make_session_factory, repository
from app.core.settings import Settings
from app.core.storage import open_store
from cahp_engine.run import RunHooks, RunReport, RunRequest, run_pruning
from tests.support import jobs as jobs_support
from tests.support.helpers import (
    free_port,
    job_body,
    migrated_engine,
    new_key,
    service_settings,
    write_split,
    write_tiny_dataset,
    write_tiny_model,
)
from worker.runner import Outcome, WorkerContext, execute_job

CHROMIUM = "/usr/bin/chromium"
#: Flags for a quiet, offline, headless Chromium in a container (no sandbox: tests run as root).
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
#: How long a test waits for something to appear: generous, because two cores are shared.
WAIT_MS = 30_000


class LogTap(logging.Handler):
    """Everything the server process logs while it runs, as text (what an operator's log would hold)."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        self._buffer = io.StringIO()
        self._lock_text = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        line = self.format(record)
        with self._lock_text:
            self._buffer.write(line + "\n")

    @property
    def text(self) -> str:
        with self._lock_text:
            return self._buffer.getvalue()


@dataclass
class Console:
    """A served app, its settings and database, and an API key (``None`` in no-auth mode)."""

    settings: Settings
    engine: Engine
    app: FastAPI
    url: str
    key: str | None
    log: LogTap
    local_root: Path
    jobs: dict[str, str] = field(default_factory=dict)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=60)

    def worker(self, worker_id: str = "ui-test-worker") -> WorkerContext:
        return WorkerContext(settings=self.settings, sessions=make_session_factory(self.engine),
                             store=open_store(self.settings), worker_id=worker_id)

    def submit(self, body: dict[str, Any]) -> str:
        with self.client() as client:
            response = client.post("/v1/jobs", json=body)
        assert response.status_code == 202, response.text
        return str(response.json()["id"])

    def job(self, job_id: str) -> dict[str, Any]:
        with self.client() as client:
            answer: dict[str, Any] = client.get(f"/v1/jobs/{job_id}").json()
        return answer


@contextmanager
def serve(app: FastAPI, log: LogTap) -> Iterator[str]:
    """Serve ``app`` with uvicorn on a free loopback port in a thread; yields its base URL.

    Access logging is on, and every record of the uvicorn, app and root loggers at INFO and above goes
    to ``log``, so a test can check what a server log would show.
    """
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=True, ws="none",
                            lifespan="on", log_level="info")
    server = uvicorn.Server(config)
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.INFO)
    root.addHandler(log)
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not start on port {port}:\n{log.text[-2000:]}")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(60)
        root.removeHandler(log)
        root.setLevel(level)


@contextmanager
def console(tmp: Path, *, no_auth: bool = False, **overrides: Any) -> Iterator[Console]:
    """A migrated database under ``tmp``, an API key (unless ``no_auth``), and the app served
    (``overrides``: other settings)."""
    settings = service_settings(tmp, no_auth=no_auth, **overrides)
    engine = migrated_engine(settings)
    key = None if no_auth else new_key(engine, "ui-tester")
    app = create_app(settings)
    log = LogTap()
    try:
        with serve(app, log) as url:
            yield Console(settings=settings, engine=engine, app=app, url=url, key=key, log=log,
                          local_root=settings.allowed_local_roots[0])
    finally:
        engine.dispose()


def tiny_inputs(root: Path, *, layers: int = 2, heads: int = 4) -> tuple[Path, Path]:
    """A tiny random classifier and a learnable three-class dataset, as directories under ``root``."""
    model = root / f"model-{layers}x{heads}"
    if not model.exists():
        if (layers, heads) == (2, 4):
            write_tiny_model(model)
        else:
            from tests.support.tiny_models import make_classifier, make_tokenizer

            classifier: Any = make_classifier("bert", num_labels=3, layers=layers, heads=heads)
            classifier.save_pretrained(model)
            make_tokenizer().save_pretrained(model)
    data = root / "data"
    if not data.exists():
        write_tiny_dataset(data, train=90, test=45)
    return model, data


def run_finished_job(console: Console, **params: Any) -> str:
    """Submit a tiny job through the API and run it to success with the worker's own function."""
    model, data = tiny_inputs(console.local_root, layers=params.pop("layers", 2), heads=params.pop("heads", 4))
    job_id = console.submit(job_body(f"file://{model}", f"file://{data}", **params))
    assert execute_job(job_id=job_id, context=console.worker()) is Outcome.succeeded
    return job_id


def run_failed_job(console: Console) -> str:
    """A job whose dataset has no ``label`` column: the worker fails it with ``invalid_dataset``.

    Submit refuses such a dataset now (the preflight), so the job is recorded as a submit of before
    recorded it, and the worker fails it as it failed such jobs then.
    """
    model, _ = tiny_inputs(console.local_root)
    bad = console.local_root / "no-label"
    for split, n, seed in (("train", 20, 1), ("test", 10, 2)):
        path = write_split(bad / f"{split}.csv", n, seed=seed)
        path.write_text(path.read_text().replace("text,label", "text,category"))
    job_id = jobs_support.record(console.engine, job_body(f"file://{model}", f"file://{bad}"))
    assert execute_job(job_id=job_id, context=console.worker()) is Outcome.failed
    return job_id


@dataclass
class RunningJob:
    """A job a real worker runs in a thread, held at the start of each stage named in ``holds``."""

    job_id: str
    thread: threading.Thread
    outcome: list[Outcome]
    reached: dict[str, threading.Event]
    released: dict[str, threading.Event]

    def wait_for(self, stage: str, timeout_s: float = 180.0) -> None:
        """Return once the run has reached ``stage`` (and is held there)."""
        assert self.reached[stage].wait(timeout_s), f"the job did not reach its {stage} stage"

    def release(self, stage: str) -> None:
        """Let the run go on past ``stage``."""
        self.released[stage].set()


@contextmanager
def running_job(console: Console, *, holds: tuple[str, ...] = ("recovery",), hold_s: float = 300.0,
                **params: Any) -> Iterator[RunningJob]:
    """A job that a real worker runs and holds at the start of each stage of ``holds`` (in run order)
    until the test releases it or a cancel is requested; yields once the first is reached.

    The pipeline is the real ``run_pruning``; its progress callback, on a held stage's first report,
    waits (at most ``hold_s``) for the release or the job's cancel flag, so the test sees the job
    running in that stage for as long as it needs, and a cancel is then honoured by the engine's own
    check between steps. ``params``: the job's settings (default: 50 recovery epochs).
    """
    model, data = tiny_inputs(console.local_root)
    job_id = console.submit(job_body(f"file://{model}", f"file://{data}", **{"epochs": 50, **params}))
    context = console.worker("ui-running-worker")
    reached = {stage: threading.Event() for stage in holds}
    released = {stage: threading.Event() for stage in holds}

    def holding_run(request: RunRequest, hooks: RunHooks) -> RunReport:
        progress = hooks.progress
        assert progress is not None

        def watch(stage: str, fraction: float) -> None:
            progress(stage, fraction)
            if stage not in reached or reached[stage].is_set():
                return
            reached[stage].set()
            deadline = time.monotonic() + hold_s
            while time.monotonic() < deadline and not released[stage].wait(0.1):
                with context.sessions() as session:
                    if repository.cancel_requested(session, job_id=job_id):
                        return

        return run_pruning(request, dataclasses.replace(hooks, progress=watch))

    outcome: list[Outcome] = []
    thread = threading.Thread(
        target=lambda: outcome.append(execute_job(job_id=job_id, context=context, pipeline=holding_run)),
        name="ui-running-job", daemon=True)
    thread.start()
    running = RunningJob(job_id=job_id, thread=thread, outcome=outcome, reached=reached, released=released)
    try:
        running.wait_for(holds[0])
        yield running
    finally:
        if thread.is_alive():
            with console.client() as client:
                client.post(f"/v1/jobs/{job_id}/cancel")
        thread.join(180)
