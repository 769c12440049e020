"""A real MLflow tracking server for the registry tests: SQLite backend, local artifact root, loopback.

It runs from its own environment (``.venv-mlflow``, made by ``.ci/run``: ``python3 -m venv .venv-mlflow &&
.venv-mlflow/bin/pip install mlflow==3.17.2``) because the server's dependencies pin ``pyarrow`` below the
project's; the service itself talks to it with ``mlflow-skinny`` (the ``mlflow`` extra). ``CAHP_MLFLOW_SERVER``
names another ``mlflow`` executable.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.support.helpers import free_port

ROOT = Path(__file__).resolve().parents[2]
#: The pinned server the tests start (the client side is pinned in pyproject's `mlflow` extra).
MLFLOW_VERSION = "3.17.2"


def mlflow_executable() -> Path | None:
    named = os.environ.get("CAHP_MLFLOW_SERVER")
    found = Path(named) if named else ROOT / ".venv-mlflow" / "bin" / "mlflow"
    return found if found.is_file() else None


@contextmanager
def mlflow_server(root: Path) -> Iterator[str]:
    """``mlflow server`` with its database and artifacts under ``root``; yields its URL once it answers."""
    executable = mlflow_executable()
    if executable is None:
        pytest.skip(f"no MLflow server: python3 -m venv .venv-mlflow && .venv-mlflow/bin/pip install "
                    f"mlflow=={MLFLOW_VERSION} (what .ci/run does)")
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = (root / "server.log").open("w")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "CAHP_"))}
    process = subprocess.Popen(
        [str(executable), "server", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
         "--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {(root / 'server.log').read_text()[-2000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server did not answer: {(root / 'server.log').read_text()[-2000:]}")
            time.sleep(0.5)
        yield url
    finally:
        # The server starts workers of its own: stop its whole session (it has one of its own).
        _signal_group(process, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        # Its job consumers may outlive the server's main process: none is left behind.
        _signal_group(process, signal.SIGKILL)
        log.close()


def _signal_group(process: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass
