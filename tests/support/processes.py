"""Real processes for the tests: start, stop and wait for them (``cahp serve``, ``cahp worker``, receivers)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

REDIS_URL = os.environ.get("CAHP_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def child_env(**cahp: str) -> dict[str, str]:
    """The environment of a service process: pinned threads, no hub, and the given CAHP_* settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAHP_")}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
               TRANSFORMERS_VERBOSITY="error", PYTHONUNBUFFERED="1")
    env.update({f"CAHP_{k.upper()}": v for k, v in cahp.items()})
    return env


def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Start ``python -m app.cli ARGS`` in its own process group, output to ``log``."""
    with open(log, "wb") as handle:  # the child keeps its own copy of the descriptor
        return subprocess.Popen([sys.executable, "-m", "app.cli", *args], env=env, stdout=handle,
                                stderr=subprocess.STDOUT, start_new_session=True, cwd=Path(__file__).parents[2])


def create_key(env: dict[str, str], name: str = "ci") -> str:
    """A new API key, made by ``cahp keys create`` against the service that ``env`` configures (the one line
    it prints)."""
    out = subprocess.run([sys.executable, "-m", "app.cli", "keys", "create", "--name", name], env=env,
                         capture_output=True, text=True, check=True, timeout=120).stdout
    assert out.count("\n") == 1 and out.endswith("\n"), f"`cahp keys create` printed more than a key: {out!r}"
    return out.strip()


def start_serve(env: dict[str, str], log: Path) -> tuple[str, subprocess.Popen[bytes]]:
    """``cahp serve`` on a free port: its URL and its process. Wait for ``ready.`` in ``log`` before using it."""
    from tests.support.helpers import free_port

    port = free_port()
    return f"http://127.0.0.1:{port}", start(["serve", "--port", str(port)], env, log)


@dataclass(frozen=True)
class Served:
    """A ``cahp serve`` of a test (the API and its embedded worker) and an API key it accepts."""

    url: str
    process: subprocess.Popen[bytes]
    key: str
    env: dict[str, str]
    data_dir: Path
    log: Path

    @property
    def auth(self) -> dict[str, str]:
        """The ``Authorization`` header of its key."""
        return {"Authorization": f"Bearer {self.key}"}

    @property
    def cli(self) -> list[str]:
        """What points ``cahp`` at it: ``--url`` and ``--api-key``."""
        return ["--url", self.url, "--api-key", self.key]

    def logs(self) -> str:
        """What it has written to its log so far."""
        return self.log.read_text(errors="replace")


@contextmanager
def serving(tmp_path: Path, **cahp: str) -> Iterator[Served]:
    """``cahp serve`` on a free port with its data under ``tmp_path / "cahp-data"``, the ``CAHP_*`` settings
    ``cahp`` (:func:`child_env`) and a key made by ``cahp keys create``; its log is ``tmp_path / "serve.log"``.

    Yields once it answers ``/readyz`` and its log says ``ready.`` (its worker is up); stops it on the way out.
    """
    data_dir = tmp_path / "cahp-data"
    env = child_env(data_dir=str(data_dir), **cahp)
    key = create_key(env)
    log = tmp_path / "serve.log"
    url, process = start_serve(env, log)
    try:
        served = Served(url=url, process=process, key=key, env=env, data_dir=data_dir, log=log)
        wait_for(lambda: answers_ready(url) and "ready." in served.logs(), timeout=120,
                 what="cahp serve and its worker", log=log)
        yield served
    finally:
        stop(process)


def answers_ready(url: str) -> bool:
    """Whether the service at ``url`` answers ``/readyz`` with 200."""
    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def stop(process: subprocess.Popen[bytes], grace_s: float = 30.0) -> None:
    """SIGTERM the process (it stops its own children), then SIGKILL its whole group if needed."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)  # anything left in the group, e.g. a stuck worker child
    except ProcessLookupError:
        pass
    process.wait()


def group_alive(pgid: int) -> bool:
    """Whether any process of the group ``pgid`` is still running (zombies excepted)."""
    for status in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = status.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


def wait_for(condition: Callable[[], bool], *, timeout: float, what: str, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    tail = log.read_text(errors="replace")[-4000:] if log is not None and log.exists() else ""
    raise AssertionError(f"timed out after {timeout} s waiting for {what}\n--- log ---\n{tail}")


def poll_job(client: httpx.Client | object, job_id: str, until: Callable[[dict], bool], *, timeout: float,
             log: Path | None = None) -> dict:
    seen: dict = {}

    def check() -> bool:
        nonlocal seen
        seen = client.get(f"/v1/jobs/{job_id}").json()  # type: ignore[attr-defined]
        return until(seen)

    wait_for(check, timeout=timeout, what=f"job {job_id} (last seen {seen})", log=log)
    return seen
