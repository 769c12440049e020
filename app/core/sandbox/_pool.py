"""A small pool of inspection children, each a separate Python process under hard limits.

Every read of content a key holder sent or named (archive members, safetensors headers, configs,
dataset cards, split files) happens in one of these children, never in the API's own process: a
file that makes a parser take gigabytes, loop, or recurse costs a child, which is ended and
replaced, and the API keeps serving. A child is reused for the next task while it stays within its
limits; one that broke a limit is killed and a fresh one started on the next call.

The limits (docs/operations.md, "The inspection sandbox"):

* address space, ``RLIMIT_AS`` (``CAHP_INSPECTION_MEMORY_BYTES``), set by the child on itself;
* CPU seconds per task, ``RLIMIT_CPU`` (``CAHP_INSPECTION_CPU_S``);
* wall time per task (``CAHP_INSPECTION_WALL_S``), kept by the caller, which kills a late child;
* the size of the answer (``CAHP_INSPECTION_OUTPUT_BYTES``): plain JSON, read by the caller with
  this cap, so only a bounded summary ever enters the API;
* at most ``CAHP_INSPECTION_WORKERS`` children at once; a caller past that waits for a free one.
"""

from __future__ import annotations

import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from app.core import errors as service_errors
from app.core.errors import (
    InspectionCpuLimitError,
    InspectionFailedError,
    InspectionLimitError,
    InspectionMemoryLimitError,
    InspectionOutputLimitError,
    InspectionTimeLimitError,
    NestingTooDeepError,
    ServiceError,
)
from app.core.sandbox._frames import HEADER, frame
from app.core.settings import Settings

logger = logging.getLogger(__name__)
_ROOT = Path(__file__).resolve().parents[3]  # the directory that holds the `app` package
#: Room for the JSON envelope around an answer of ``output_bytes``.
_ENVELOPE = 256


@dataclass(frozen=True)
class Limits:
    """The hard limits of one inspection (see the module docstring for the settings)."""

    memory_bytes: int
    cpu_s: int
    wall_s: float
    output_bytes: int


class _Failed(Exception):
    """The child ended, ran late or sent too much; it is not reused."""

    def __init__(self, why: str, detail: int | None = None) -> None:
        super().__init__(why)
        self.why = why
        self.detail = detail


class _Child:
    """One inspection process and its pipes."""

    def __init__(self, limits: Limits) -> None:
        # A scratch directory of its own, removed with the child: one killed mid-task leaves nothing.
        self.scratch = tempfile.mkdtemp(prefix="cahp-inspect-")
        env = dict(os.environ, TMPDIR=self.scratch)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), env.get("PYTHONPATH", "")) if p)
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", ARROW_NUM_THREADS="1",
                   ARROW_IO_THREADS="1", TOKENIZERS_PARALLELISM="false")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "app.core.sandbox._child", str(limits.memory_bytes),
             str(limits.output_bytes + _ENVELOPE)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True,
        )

    def call(self, request: bytes, *, deadline: float, output_bytes: int) -> dict[str, Any]:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(frame(request))
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._ended() from None
        (length,) = HEADER.unpack(self._read(HEADER.size, deadline))
        if length > output_bytes + _ENVELOPE:
            raise _Failed("output", length)
        try:
            answer = json.loads(self._read(length, deadline))
        except (ValueError, RecursionError):
            raise _Failed("output", length) from None
        if not isinstance(answer, dict):
            raise _Failed("output", length)
        return answer

    def _read(self, n: int, deadline: float) -> bytes:
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        poller = select.poll()  # not select(): an API holding many connections has descriptors past 1024
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        chunks: list[bytes] = []
        got = 0
        while got < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not poller.poll(remaining * 1000):
                raise _Failed("time")
            chunk = os.read(fd, min(n - got, 1 << 20))
            if not chunk:
                raise self._ended()
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def _ended(self) -> _Failed:
        try:
            code = self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        return _Failed("ended", code)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:  # unkillable for now; the kernel reaps it later
            logger.warning("inspection child %s did not end after SIGKILL", self.process.pid)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        shutil.rmtree(self.scratch, ignore_errors=True)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None


class InspectionPool:
    """At most ``size`` inspection children under ``limits``, started when first needed and reused."""

    def __init__(self, limits: Limits, size: int) -> None:
        self.limits = limits
        self.size = size
        self._idle: list[_Child] = []
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(size)
        self.closed = False
        #: The environment the children start with (they keep the one they started with).
        self.environment = environment_key()

    def run(self, task: str, *, what: str, settings: Settings, **kwargs: Any) -> Any:
        """Run the task ``task`` of :mod:`app.core.sandbox._tasks` in a child and return its plain-data answer.

        ``what`` says what was being inspected, for the messages ("inspecting the upload"); the task
        gets ``settings`` and ``kwargs``, which must be JSON (strings, numbers, lists, mappings).

        Raises
        ------
        InspectionLimitError
            A subclass naming the limit that was reached, its value and its setting.
        ServiceError, CahpError
            What the task raised (its message at most a couple of thousand characters).
        """
        request = json.dumps({"task": task, "settings": settings_data(settings), "kwargs": kwargs,
                              "cpu_s": self.limits.cpu_s}).encode()
        with self._child() as (child, keep):
            try:
                answer = child.call(request, deadline=time.monotonic() + self.limits.wall_s,
                                    output_bytes=self.limits.output_bytes)
            except _Failed as failed:
                raise self._limit_error(failed, what) from None
            if "ok" in answer:
                keep()
                return answer["ok"]
            if "limit" in answer:
                raise self._limit_error(_Failed(str(answer["limit"]), answer.get("size")), what)
            keep()
            raise _rebuilt(answer.get("error"))

    @contextmanager
    def _child(self) -> Iterator[tuple[_Child, Any]]:
        self._slots.acquire()
        child: _Child | None = None
        kept = False

        def keep() -> None:
            nonlocal kept
            kept = True

        try:
            with self._lock:
                while self._idle and child is None:
                    candidate = self._idle.pop()
                    if candidate.alive:
                        child = candidate
                    else:
                        candidate.kill()
            if child is None:
                child = _Child(self.limits)
            yield child, keep
        finally:
            if child is not None:
                with self._lock:
                    keep_child = kept and child.alive and not self.closed
                    if keep_child:
                        self._idle.append(child)
                if not keep_child:
                    child.kill()
            self._slots.release()

    def close(self) -> None:
        """End the idle children (a running task's child ends when its caller is done with it)."""
        with self._lock:
            self.closed = True
            idle, self._idle = self._idle, []
        for child in idle:
            child.kill()

    def _limit_error(self, failed: _Failed, what: str) -> InspectionLimitError:
        limits = self.limits
        if failed.why == "time":
            return InspectionTimeLimitError(
                f"{what} took longer than the limit of {limits.wall_s:g} s (CAHP_INSPECTION_WALL_S); the input is "
                "too large or too complex to inspect here: send a smaller one, or ask the operator to raise the limit")
        if failed.why == "nesting":
            return NestingTooDeepError(
                f"{what} found JSON or YAML nested deeper than Python's recursion limit ({sys.getrecursionlimit()}); "
                "flatten it")
        if failed.why == "output":
            return InspectionOutputLimitError(
                f"{what} gave a summary of more than the limit of {limits.output_bytes:,} bytes "
                "(CAHP_INSPECTION_OUTPUT_BYTES); the input has too many files, tensors or columns to record")
        if failed.why == "ended" and failed.detail == -signal.SIGXCPU:
            return InspectionCpuLimitError(
                f"{what} used more than the limit of {limits.cpu_s} CPU seconds (CAHP_INSPECTION_CPU_S); the input "
                "is too large or too complex to inspect here: send a smaller one, or ask the operator to raise it")
        ended = f" (the inspection process ended with status {failed.detail})" if failed.why == "ended" else ""
        return InspectionMemoryLimitError(
            f"{what} needed more than the memory limit of {limits.memory_bytes:,} bytes "
            f"(CAHP_INSPECTION_MEMORY_BYTES){ended}; the input decodes to too much to inspect here: send a smaller "
            "one, or ask the operator to raise the limit")


def environment_key() -> int:
    """A fingerprint of this process's environment, which a child copies when it starts."""
    return hash(frozenset(os.environ.items()))


def settings_data(settings: Settings) -> dict[str, Any]:
    """``settings`` as JSON values that :class:`Settings` reads back the same (secrets included)."""
    data = {}
    for name, value in settings.model_dump().items():
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        elif isinstance(value, tuple | list):
            value = [str(v) if isinstance(v, Path) else v for v in value]
        elif isinstance(value, Path):
            value = str(value)
        data[name] = value
    return data


def _rebuilt(error: Any) -> Exception:
    """The exception a child reported, when it is one of the service's or the engine's; else ``inspection_failed``.

    A parser's own error on a hostile file (pyarrow's, PyYAML's, a ``KeyError``) is still the file's
    fault, not the service's: a 422 that names it, logged for the operator, never a 500.
    """
    from cahp_engine import errors as engine_errors

    if not isinstance(error, dict):
        return InspectionFailedError("the inspection process sent an answer that cannot be read")
    module, name, message = error.get("module"), error.get("name"), str(error.get("message", ""))
    known = {service_errors.__name__: service_errors, engine_errors.__name__: engine_errors}
    kind = getattr(known[module], str(name), None) if module in known else None
    if isinstance(kind, type) and issubclass(kind, ServiceError | engine_errors.CahpError):
        exc: Exception = kind.__new__(kind)
        Exception.__init__(exc, message)
        return exc
    logger.warning("an inspection failed with %s: %s", name, message[:500])
    return InspectionFailedError(f"the file could not be inspected ({str(name)[:80]}: {message[:300]}); check that it "
                                 "is what its name says, and not truncated")
