"""The client rides out what deploys and networks do: an API restart during ``cahp wait``, a download
cut off half-way, and answers that say "busy, come back later" (429/503 with ``Retry-After``).

Real processes and sockets: ``cahp serve`` and ``cahp worker`` (prefork, with its metrics port) on
the embedded broker, ``cahp wait`` as separate processes, a TCP proxy that cuts a transfer, and an
HTTP server that answers 503 before it answers.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.cli import main
from app.client import ApiClient, ServerError
from app.http_headers import retry_after_s
from tests.support.helpers import (
    free_port,
    job_body,
    migrated_engine,
    new_key,
    service_settings,
    write_tiny_dataset,
    write_tiny_model,
)
from tests.support.jobs import finish, start, store
from tests.support.processes import child_env, stop, wait_for
from tests.support.processes import start as start_process
from tests.support.receiver import CuttingProxy
from tests.support.stack import SLOW_EPOCHS, settings_env, start_server


def _wait_process(args: list[str], log: Path) -> tuple[subprocess.Popen[bytes], Path, Path]:
    out, err = log.with_suffix(".out"), log.with_suffix(".err")
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "app.cli", "wait", *args], stdout=stdout, stderr=stderr,
                                   env=child_env())
    return process, out, err


def test_cahp_wait_survives_an_api_restart_while_the_worker_runs_on(tmp_path: Path) -> None:
    settings = service_settings(tmp_path, progress_interval_s=0.2, events_poll_s=0.2)
    engine = migrated_engine(settings)
    key = new_key(engine, "ci")
    local = settings.allowed_local_roots[0]
    body = job_body(f"file://{write_tiny_model(local / 'model')}", f"file://{write_tiny_dataset(local / 'data')}",
                    epochs=SLOW_EPOCHS, batch_size=2)
    port, metrics_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    env = settings_env(settings)
    api = start_process(["serve", "--port", str(port), "--workers", "0"], env, tmp_path / "api-1.log")
    worker_env = child_env(**{k[len("CAHP_"):].lower(): v for k, v in settings.child_environment().items()})
    worker = start_process(["worker", "--metrics-port", str(metrics_port)], worker_env, tmp_path / "worker.log")
    waits: list[tuple[subprocess.Popen[bytes], Path, Path]] = []
    try:
        wait_for(lambda: "ready." in (tmp_path / "worker.log").read_text(errors="replace"), timeout=120,
                 what="the worker", log=tmp_path / "worker.log")
        wait_for(lambda: _answers(url), timeout=120, what="the API", log=tmp_path / "api-1.log")
        auth = {"Authorization": f"Bearer {key}"}
        job_id = httpx.post(f"{url}/v1/jobs", json=body, headers=auth, timeout=30).json()["id"]
        common = ["--url", url, "--api-key", key, "--timeout", "600"]
        waits = [_wait_process([job_id, "--interval", "0.3", *common], tmp_path / "wait"),
                 _wait_process([job_id, "--follow", *common], tmp_path / "follow")]
        wait_for(lambda: httpx.get(f"{url}/v1/jobs/{job_id}", headers=auth).json()["stage"] == "recovery",
                 timeout=180, what="the job to reach recovery", log=tmp_path / "worker.log")

        stop(api)  # a deploy: the API goes away while the worker goes on with the job
        wait_for(lambda: all("trying again" in err.read_text() for _, _, err in waits), timeout=120,
                 what="both clients to see the API gone", log=tmp_path / "worker.log")
        api = start_process(["serve", "--port", str(port), "--workers", "0"], env, tmp_path / "api-2.log")
        for process, _out, err in waits:
            assert process.wait(timeout=300) == 0, err.read_text() + (tmp_path / "worker.log").read_text()[-3000:]
            assert "trying again" in err.read_text()  # it did see the API go away
        job = httpx.get(f"{url}/v1/jobs/{job_id}", headers=auth).json()
        assert job["status"] == "succeeded"
        # --follow printed the whole log exactly once, across the reconnect.
        lines = [e["message"] for e in httpx.get(f"{url}/v1/jobs/{job_id}/logs", headers=auth).json()["data"]]
        assert waits[1][1].read_text().splitlines() == lines
        # The worker's own metrics port counts the job its pool process ran.
        text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
        finished = {tuple(sorted(s.labels.items())): s.value for f in text_string_to_metric_families(text)
                    for s in f.samples if s.name == "cahp_jobs_finished_total"}
        assert finished == {(("status", "succeeded"),): 1.0}
    finally:
        for process, _, _ in waits:
            if process.poll() is None:
                process.kill()
        stop(worker)
        stop(api)
        engine.dispose()


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_an_interrupted_download_resumes_and_verifies(tmp_path: Path) -> None:
    settings = service_settings(tmp_path)
    engine = migrated_engine(settings)
    key = new_key(engine, "ci")
    blob = os.urandom(3 * 1024 * 1024)
    api = start_server(settings, tmp_path / "api.log")
    try:
        auth = {"Authorization": f"Bearer {key}"}
        job_id = httpx.post(f"{api.url}/v1/jobs", json=job_body("hf://org/model", "hf://datasets/org/data"),
                            headers=auth).json()["id"]
        start(engine, job_id)
        finish(engine, job_id, artifacts=store(settings, job_id, {"model.bin": blob}, tmp_path / "files"))
        port = int(api.url.rsplit(":", 1)[1])

        # The connection is cut after 1 MB; the client asks for the rest with Range and checks the sha256.
        proxy = CuttingProxy(port, cut_marker=b"/artifacts/model.bin", cut_after=1024 * 1024)
        out = tmp_path / "downloads"
        assert main(["download", job_id, "model.bin", "-o", str(out), "--url", proxy.url, "--api-key", key]) == 0
        assert proxy.cuts == 1 and (out / "model.bin").read_bytes() == blob
        ranges = [r for r in proxy.requests if b"range: bytes=" in r.lower()]
        assert len(ranges) == 1 and not (out / "model.bin.partial").exists()
        resumed_from = int(ranges[0].lower().split(b"range: bytes=")[1].split(b"-")[0])
        assert 0 < resumed_from <= 1024 * 1024

        # A .partial left by an earlier run is resumed too; a corrupt one is caught by the checksum.
        watcher = CuttingProxy(port, cut_marker=b"\x00never", cut_after=0)
        again = tmp_path / "again"
        again.mkdir()
        (again / "model.bin.partial").write_bytes(blob[:1000])
        assert main(["download", job_id, "model.bin", "-o", str(again), "--url", watcher.url, "--api-key", key]) == 0
        assert (again / "model.bin").read_bytes() == blob
        assert any(b"range: bytes=1000-" in r.lower() for r in watcher.requests)
        bad = tmp_path / "bad"
        bad.mkdir()
        (bad / "model.bin.partial").write_bytes(b"\x00" * 1000)
        assert main(["download", job_id, "model.bin", "-o", str(bad), "--url", api.url, "--api-key", key]) == 1
        assert not (bad / "model.bin.partial").exists()
        assert main(["download", job_id, "model.bin", "-o", str(bad), "--url", api.url, "--api-key", key]) == 0
        assert hashlib.sha256((bad / "model.bin").read_bytes()).hexdigest() == hashlib.sha256(blob).hexdigest()
        proxy.close()
        watcher.close()
    finally:
        stop(api.process)
        engine.dispose()


def test_a_submit_whose_answer_is_lost_is_retried_into_the_same_job(tmp_path: Path, capsys) -> None:
    """The connection drops after the API recorded the job but before its answer arrived: ``cahp submit``
    retries with the Idempotency-Key it sent by default, and the API answers with the job it made."""
    settings = service_settings(tmp_path)
    engine = migrated_engine(settings)
    key = new_key(engine, "ci")
    api = start_server(settings, tmp_path / "api.log")
    proxy = CuttingProxy(int(api.url.rsplit(":", 1)[1]), cut_marker=b"POST /v1/jobs", cut_after=0)
    try:
        common = ["--url", proxy.url, "--api-key", key]
        assert main(["submit", "--model", "hf://org/model", "--dataset", "hf://datasets/org/data", *common]) == 0
        job_id = capsys.readouterr().out.strip()
        posts = [r for r in proxy.requests if r.startswith(b"POST /v1/jobs")]
        assert proxy.cuts == 1 and len(posts) == 2  # the first answer was lost, the retry got one
        sent = {line.split(b":", 1)[1].strip() for post in posts for line in post.split(b"\r\n")
                if line.lower().startswith(b"idempotency-key:")}
        assert len(sent) == 1 and next(iter(sent)).startswith(b"cahp-")  # one key, sent by default, both times
        listed = httpx.get(f"{api.url}/v1/jobs", headers={"Authorization": f"Bearer {key}"}).json()["data"]
        assert [job["id"] for job in listed] == [job_id]
    finally:
        proxy.close()
        stop(api.process)
        engine.dispose()


class _Busy:
    """A real HTTP server that answers ``busy`` times with ``status`` and ``Retry-After``, then a job."""

    def __init__(self, *, busy: int, status: int, retry_after: str) -> None:
        self.times: list[float] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                outer.times.append(time.monotonic())
                if len(outer.times) <= busy:
                    body = json.dumps({"code": "service_unavailable", "detail": "busy"}).encode()
                    self.send_response(status)
                    self.send_header("Retry-After", retry_after)
                else:
                    body = json.dumps({"id": "j1", "status": "running"}).encode()
                    self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("status", [429, 502, 503, 504])
def test_busy_answers_are_retried_no_sooner_than_retry_after_asks(status: int) -> None:
    busy = _Busy(busy=2, status=status, retry_after="1")
    try:
        with ApiClient(busy.url, "key", timeout=30) as client:
            assert client.job("j1").status == "running"
        assert len(busy.times) == 3
        assert all(later - earlier >= 0.95 for earlier, later in zip(busy.times, busy.times[1:], strict=False))
    finally:
        busy.close()


def test_retrying_stops_at_the_timeout_and_other_errors_are_not_retried() -> None:
    always = _Busy(busy=10**6, status=503, retry_after="1")
    failing = _Busy(busy=10**6, status=500, retry_after="1")
    try:
        # Retry-After 1 s within 10 s: at least a retry however slow each request, at most one a second.
        with ApiClient(always.url, "key", timeout=10) as client, pytest.raises(ServerError) as busy:
            client.job("j1")
        assert busy.value.status == 503 and 2 <= len(always.times) <= 11
        with ApiClient(failing.url, "key", timeout=30) as client, pytest.raises(ServerError) as broken:
            client.job("j1")
        assert broken.value.status == 500 and len(failing.times) == 1
    finally:
        always.close()
        failing.close()


def test_retry_after_is_read_as_seconds_or_as_a_date() -> None:
    assert retry_after_s("7") == 7.0 and retry_after_s(None) is None and retry_after_s("soon") is None
    later = retry_after_s(time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 30)))
    assert later is not None and 25 <= later <= 31
