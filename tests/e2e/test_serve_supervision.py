"""``cahp serve`` keeps its embedded worker running: one that exits is replaced, and the server says so.

Real processes: a ``cahp serve`` in embedded mode (SQLite broker, local artifacts) and the worker it
starts. The lease is ten minutes and no sweeper runs, so a job can move on only because the stopping
worker handed it back and the server started another worker: no restart of the server, no lapsed lease.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import tarfile
from pathlib import Path

import httpx

from tests.support.helpers import free_port, write_tiny_dataset, write_tiny_model
from tests.support.processes import child_env, serving, start, stop, wait_for

SLOW = {"lease_s": "600", "heartbeat_interval_s": "20", "sweep_interval_s": "0", "requeue_after_s": "3600",
        "checkpoint_interval_s": "0", "progress_interval_s": "0.2", "cancel_check_interval_s": "0.2"}


def _workers_of(server: int) -> list[int]:
    """Pids of live ``app.cli worker`` processes started by the process ``server``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[1]) == server and b"app.cli" in cmdline and b"worker" in cmdline:
            found.append(int(stat.parent.name))
    return found


def _status(url: str, path: str) -> int:
    try:
        return httpx.get(f"{url}{path}", timeout=5).status_code
    except httpx.HTTPError:
        return 0


def _metric(url: str, name: str) -> float | None:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    return None if found is None else float(found.group(1))


def _saved(data_dir: Path, job_id: str) -> bool:
    path = data_dir / "artifacts" / "jobs" / job_id / "checkpoints" / "index.json"
    try:
        return "recovery_training" in json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return False


def test_a_sigtermed_worker_hands_its_job_back_and_the_server_starts_one_that_resumes_it(tmp_path: Path) -> None:
    with serving(tmp_path, **SLOW) as served:
        url, server, log, data_dir = served.url, served.process, served.log, served.data_dir
        assert _metric(url, "cahp_local_workers") == 1 and _metric(url, "cahp_local_worker_restarts_total") == 0
        (first,) = _workers_of(server.pid)
        model = write_tiny_model(tmp_path / "inputs" / "model")
        dataset = write_tiny_dataset(tmp_path / "inputs" / "dataset", train=200)
        with httpx.Client(base_url=url, headers=served.auth, timeout=30) as http:
            uris = []
            for path in (model, dataset):
                archive = tmp_path / f"{path.name}.tar.gz"
                with tarfile.open(archive, "w:gz") as tar:
                    tar.add(path, arcname=path.name)
                sent = http.post("/v1/uploads", files={"file": (archive.name, archive.read_bytes())})
                uris.append(sent.json()["uri"])
            body = {"model": {"uri": uris[0]}, "dataset": {"uri": uris[1]},
                    "params": {"epochs": 1000, "batch_size": 2, "dense_finetune": "never", "untrained_dense": "warn",
                               "max_length": 32}}
            job_id = http.post("/v1/jobs", json=body).json()["id"]

            def job() -> dict:
                return dict(http.get(f"/v1/jobs/{job_id}").json())

            def logs() -> str:
                return "\n".join(e["message"] for e in http.get(f"/v1/jobs/{job_id}/logs").json()["data"])

            wait_for(lambda: job()["stage"] == "recovery" and _saved(data_dir, job_id), timeout=300,
                     what="the job to save a recovery epoch", log=log)
            before = job()
            assert before["status"] == "running", before

            subprocess.run(["kill", "-TERM", str(first)], check=True)  # as an operator or an OOM warning would
            wait_for(lambda: "is handed back to the queue" in logs(), timeout=120, what="the hand-back", log=log)
            stopped = re.search(r"recovery: stopped at step (\d+); its state is saved for the next attempt", logs())
            assert stopped is not None, logs()

            # The server replaces the worker that exited; the new one resumes from the saved step.
            going_on = f"recovery: going on from step {stopped.group(1)} (saved by an earlier attempt)"
            wait_for(lambda: going_on in logs(), timeout=240, what="a new worker to resume the job", log=log)
            (second,) = _workers_of(server.pid)
            assert second != first and server.poll() is None
            assert _metric(url, "cahp_local_worker_restarts_total") == 1 and _metric(url, "cahp_local_workers") == 1
            assert _status(url, "/readyz") == 200
            text = logs()
            # The stopping worker never claimed the job again: every attempt after the hand-back is another's.
            first_worker = re.search(r"attempt 1 on worker (\S+),", text)
            assert first_worker is not None
            after = text.split("is handed back to the queue", 1)[1]
            claims = re.findall(r"attempt \d+ on worker (\S+),", after)
            assert claims and first_worker.group(1) not in claims, text
            assert not Path(f"/proc/{first}").exists() or "Z" not in Path(f"/proc/{first}/stat").read_text()

            assert http.post(f"/v1/jobs/{job_id}/cancel").status_code == 202
            wait_for(lambda: job()["status"] == "cancelled", timeout=120, what="the job to be cancelled", log=log)


def test_readyz_says_not_ready_while_no_worker_runs_and_ready_once_one_does(tmp_path: Path) -> None:
    # The worker's metrics port is taken: every worker the server starts exits at once.
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    env = child_env(data_dir=str(tmp_path / "cahp-data"), worker_metrics_port=str(blocker.getsockname()[1]))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    server = start(["serve", "--port", str(port)], env, log)
    try:
        wait_for(lambda: "starting another in" in log.read_text(errors="replace"), timeout=120,
                 what="the first worker to fail", log=log)
        wait_for(lambda: _status(url, "/readyz") == 503 and _metric(url, "cahp_local_workers") == 0, timeout=60,
                 what="/readyz to say not ready", log=log)
        problem = httpx.get(f"{url}/readyz", timeout=5).json()
        assert problem["code"] == "service_unavailable" and "worker" in problem["detail"], problem
        assert _status(url, "/healthz") == 200  # alive, only not ready

        blocker.close()  # the next worker starts
        wait_for(lambda: _status(url, "/readyz") == 200, timeout=180, what="a worker to start", log=log)
        ready = httpx.get(f"{url}/readyz", timeout=5).json()
        assert ready["workers"] == 1 and (_metric(url, "cahp_local_worker_restarts_total") or 0) >= 1
    finally:
        blocker.close()
        stop(server)
