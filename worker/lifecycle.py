"""Worker processes that never outlive the process that started them.

``cahp serve`` in embedded mode starts its worker as a child. If the server is killed (``kill -9``,
an OOM kill), nothing runs its clean-up, and a worker left behind would keep taking jobs; every
restart would add one more. Two mechanisms close that, on every worker process:

* the parent-death signal (Linux ``prctl(PR_SET_PDEATHSIG)``), set in the child before it runs
  Python, kills the embedded worker the moment its server dies;
* a watchdog thread that checks every second whether the process's parent is still the one it
  started under (re-parenting to init or a subreaper means it died), for systems without
  ``prctl`` and for Celery's pool processes, whose parent is the worker's main process.

A job that was running is not lost: its lease stops being renewed and the sweeper re-queues it
(docs/operations.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import signal
import threading

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
#: Exit status of a process that stopped because its parent died.
PARENT_GONE_EXIT = 70
#: The environment variable through which ``cahp serve`` tells its worker which process to follow.
PARENT_PID_ENV = "CAHP_PARENT_PID"


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent dies; False where unsupported.

    Safe to call between ``fork`` and ``exec`` (as a ``preexec_fn``): it only calls ``prctl``.
    """
    if not hasattr(os, "getppid") or not os.uname().sysname == "Linux":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return bool(libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def die_with_parent(expected_ppid: int) -> None:
    """``preexec_fn`` for a child that must not outlive ``expected_ppid``.

    If the parent died between ``fork`` and the ``prctl`` call, no signal would ever come, so the
    parent is checked once more afterwards.
    """
    set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != expected_ppid:
        os._exit(PARENT_GONE_EXIT)


def watch_parent(expected_ppid: int | None = None, *, interval_s: float = 1.0) -> threading.Thread:
    """Start a daemon thread that ends this process when its parent is no longer ``expected_ppid``.

    ``expected_ppid`` defaults to the current parent. The process exits with
    :data:`PARENT_GONE_EXIT` without running clean-up handlers: they could block on the job the
    process was running, which the sweeper gives to another worker.
    """
    parent = os.getppid() if expected_ppid is None else expected_ppid
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(interval_s):
            if os.getppid() != parent:
                logger.error("parent process %d is gone; this worker process (%d) exits", parent, os.getpid())
                os._exit(PARENT_GONE_EXIT)

    if os.getppid() != parent:
        os._exit(PARENT_GONE_EXIT)
    thread = threading.Thread(target=run, name="parent-watchdog", daemon=True)
    thread.start()
    return thread


def follow_parent_from_environment() -> None:
    """In a worker started by ``cahp serve``: exit with the server (the pid is in the environment)."""
    value = os.environ.get(PARENT_PID_ENV)
    if value and value.isdigit():
        watch_parent(int(value))
