"""``cahp serve`` with no configuration (embedded broker, SQLite, local artifacts), driven by the CLI."""

from __future__ import annotations

import hashlib
import json
import re
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import httpx
import pytest

from app.cli import main
from cahp_engine import load_pruned
from cahp_engine.run import ARTIFACT_FILES
from tests.support.helpers import write_split, write_tiny_dataset, write_tiny_model
from tests.support.processes import answers_ready, child_env, group_alive, serving, start, stop, wait_for


def test_embedded_service_runs_a_job_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with serving(tmp_path) as served:
        # `cahp keys create` printed the key alone (serving checks it is its one line).
        assert re.fullmatch(r"cahp_[a-z0-9]{12}_[A-Za-z0-9_-]{43}", served.key)
        url, server, log, common = served.url, served.process, served.log, served.cli
        model = write_tiny_model(tmp_path / "inputs" / "model")
        dataset = write_tiny_dataset(tmp_path / "inputs" / "dataset")

        # Local directories are packed and uploaded by `cahp submit` itself.
        assert main(["submit", "--model", str(model), "--dataset", str(dataset), "--param", "epochs=1",
                     "--param", "dense_finetune=\"never\"", "--param", "untrained_dense=\"warn\"",
                     "--param", "max_length=32", "--json",
                     "--idempotency-key", "build-17", *common]) == 0
        job = json.loads(capsys.readouterr().out)
        assert job["status"] == "queued" and job["model"]["uri"].startswith("upload://")

        assert main(["wait", job["id"], "--timeout", "180", "--interval", "0.5", *common]) == 0, log.read_text()
        assert main(["status", job["id"], "--json", *common]) == 0
        status = json.loads(capsys.readouterr().out)
        assert status["status"] == "succeeded" and status["result"]["heads_total"] == 8

        out = tmp_path / "downloads"
        assert main(["download", job["id"], "-o", str(out), *common]) == 0
        assert {p.name for p in out.iterdir()} == {"model.tar.gz", "onnx.tar.gz", *ARTIFACT_FILES}
        with httpx.Client(base_url=url, headers=served.auth) as http:
            for entry in http.get(f"/v1/jobs/{job['id']}/artifacts").json()["data"]:
                assert hashlib.sha256((out / entry["name"]).read_bytes()).hexdigest() == entry["sha256"]
        with tarfile.open(out / "model.tar.gz") as tar:
            tar.extractall(tmp_path / "checkpoint", filter="data")
        assert load_pruned(tmp_path / "checkpoint" / "model") is not None

        # The console is served by the same process: the page, and a script it loads, as an installed
        # `cahp serve` ships them (README: `bin/dev serve`, then open /ui).
        page = httpx.get(f"{url}/ui", follow_redirects=True, timeout=10)
        assert page.status_code == 200 and str(page.url) == f"{url}/ui/" and "<script" in page.text
        script = httpx.get(f"{url}/ui/static/app.js", timeout=10)
        assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")

        # A dataset without the label column: refused at submit (exit 2), with what to change.
        bad = tmp_path / "inputs" / "bad"
        for split, n in (("train", 30), ("test", 10)):
            path = write_split(bad / f"{split}.csv", n, seed=3)
            path.write_text(path.read_text().replace("text,label", "text,category"))
        capsys.readouterr()
        assert main(["submit", "--model", str(model), "--dataset", str(bad), *common]) == 2
        refused = capsys.readouterr()
        assert refused.out == "" and "has no column 'label'" in refused.err and "Set `label_column`" in refused.err

        # SIGTERM stops the API and the worker it started: nothing of the group is left running.
        server.send_signal(signal.SIGTERM)
        server.wait(60)
        wait_for(lambda: not group_alive(server.pid), timeout=30, what="the embedded worker to stop", log=log)
        assert "Warm shutdown" in served.logs()


def test_no_auth_is_refused_off_loopback(tmp_path: Path) -> None:
    env = child_env(data_dir=str(tmp_path / "cahp-data"))
    refused = subprocess.run([sys.executable, "-m", "app.cli", "serve", "--host", "0.0.0.0", "--no-auth"],
                             env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "loopback" in refused.stderr


def _workers_of(server: int) -> list[int]:
    """Pids of live ``app.cli worker`` processes started by the process ``server`` (not their pool children)."""
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


def test_the_embedded_worker_dies_with_a_killed_server_and_a_restart_leaves_one(tmp_path: Path) -> None:
    with serving(tmp_path) as served:
        url, server, log = served.url, served.process, served.log
        # A job keeps the worker's pool process busy when the server is killed.
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
                    "params": {"epochs": 500, "dense_finetune": "never", "untrained_dense": "warn", "max_length": 32}}
            job = http.post("/v1/jobs", json=body).json()
            wait_for(lambda: http.get(f"/v1/jobs/{job['id']}").json()["status"] == "running", timeout=120,
                     what="the job to start", log=log)
        assert len(_workers_of(server.pid)) == 1
        server.send_signal(signal.SIGKILL)
        server.wait(10)
        # No clean-up ran in the server; the worker and its pool process go by themselves.
        wait_for(lambda: not group_alive(server.pid), timeout=60, what="the orphaned worker to exit", log=log)

        restarted = start(["serve", "--port", url.rsplit(":", 1)[1]], served.env, tmp_path / "serve2.log")
        try:
            wait_for(lambda: answers_ready(url), timeout=120, what="the restarted server", log=tmp_path / "serve2.log")
            wait_for(lambda: len(_workers_of(restarted.pid)) == 1, timeout=60, what="one worker",
                     log=tmp_path / "serve2.log")
            assert not group_alive(server.pid)
        finally:
            stop(restarted)
