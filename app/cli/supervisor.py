"""The local workers ``cahp serve`` starts, kept running: one that exits is replaced.

A worker process can end while the server goes on: told to stop (SIGTERM from an operator or an
out-of-memory killer's warning), crashed, or killed. Its running job is not lost (a stopping worker
hands it back with its resume state, a killed one's lease lapses), but without a worker nothing would
take it. The supervisor looks at its workers every second and starts a new one in the place of any
that has ended. A worker that ends soon after it started (a bad setting, a port in use) is restarted
after a delay that doubles each time, up to a minute, so a broken configuration does not spin.

The API asks it how many workers are alive: ``/readyz`` answers 503 while none is, and ``/metrics``
reports ``cahp_local_workers`` and ``cahp_local_worker_restarts_total``.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

#: A worker that lived less than this is counted as failing at start: its replacement waits longer.
QUICK_EXIT_S = 30.0
FIRST_DELAY_S = 1.0
MAX_DELAY_S = 60.0


@dataclass
class _Supervised:
    process: subprocess.Popen[bytes] | None
    started: float
    delay_s: float = FIRST_DELAY_S
    restart_at: float | None = None


class WorkerSupervisor:
    """Start ``count`` workers with ``start`` and replace any that exits until :meth:`stop`.

    Parameters
    ----------
    start : callable
        Starts one worker process and returns it.
    count : int
        How many workers to keep alive.
    pid_file : Path or None
        Rewritten with the live workers' pids after each change (an earlier server's leftovers are
        found through it).
    stop_worker : callable
        Stops one worker (SIGTERM, then SIGKILL after a grace period).
    """

    def __init__(self, start: Callable[[], subprocess.Popen[bytes]], count: int, *, pid_file: Path | None,
                 stop_worker: Callable[[subprocess.Popen[bytes]], None], poll_s: float = 1.0) -> None:
        self._start = start
        self._count = count
        self._pid_file = pid_file
        self._stop_worker = stop_worker
        self._poll_s = poll_s
        self._slots: list[_Supervised] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.restarts = 0

    @property
    def expected(self) -> int:
        """How many workers this server runs when all is well."""
        return self._count

    def alive(self) -> int:
        """How many of the workers are running now."""
        with self._lock:
            return sum(1 for slot in self._slots if slot.process is not None and slot.process.poll() is None)

    def start(self) -> WorkerSupervisor:
        now = time.monotonic()
        with self._lock:
            self._slots = [_Supervised(self._start(), now) for _ in range(self._count)]
            self._write_pids()
        if self._count:
            self._thread = threading.Thread(target=self._watch, name="worker-supervisor", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching, then stop every worker (each finishes by handing back its job)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            for slot in self._slots:
                if slot.process is not None:
                    self._stop_worker(slot.process)
            self._slots = []
            if self._pid_file is not None:
                self._pid_file.unlink(missing_ok=True)

    def _watch(self) -> None:
        while not self._stopping.wait(self._poll_s):
            with self._lock:
                if self._stopping.is_set():
                    return
                self._check(time.monotonic())

    def _check(self, now: float) -> None:
        changed = False
        for slot in self._slots:
            process = slot.process
            if process is not None and process.poll() is not None:
                lived = now - slot.started
                if lived >= QUICK_EXIT_S:
                    slot.delay_s = FIRST_DELAY_S
                wait = slot.delay_s
                slot.delay_s = min(MAX_DELAY_S, wait * 2)
                print(f"cahp: worker {process.pid} exited with status {process.returncode} after {lived:.0f} s; "
                      f"starting another in {wait:.0f} s", file=sys.stderr, flush=True)
                slot.process, slot.restart_at = None, now + wait
                changed = True
            if slot.process is None and slot.restart_at is not None and now >= slot.restart_at:
                slot.process, slot.started, slot.restart_at = self._start(), now, None
                self.restarts += 1
                print(f"cahp: started worker {slot.process.pid} in place of the one that exited",
                      file=sys.stderr, flush=True)
                changed = True
        if changed:
            self._write_pids()

    def _write_pids(self) -> None:
        if self._pid_file is None:
            return
        pids = [slot.process.pid for slot in self._slots if slot.process is not None]
        if pids:
            self._pid_file.write_text("".join(f"{pid}\n" for pid in pids))
        else:
            self._pid_file.unlink(missing_ok=True)
