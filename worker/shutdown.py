"""A worker told to stop (SIGTERM: a redeploy, a scale-down, a preempted machine) hands its job back at once.

Celery answers SIGTERM with a warm shutdown: it takes no new message and waits for the running task,
which for a pruning job can take hours, longer than any orchestrator waits before SIGKILL. So the
worker's main process, when its shutdown starts (Celery's ``worker_shutting_down`` signal), leaves a
flag file that the process running the job looks for at every step (the pool's child processes do
not get the signal themselves). The job then stops at its next step, keeps the resume state it saved
(:mod:`worker.resume_store`), gives its attempt back to the queue and sends its message again, so that
another worker resumes it within seconds (:func:`worker.runner.execute_job`).

The flag is a file named after the main process's pid in the work directory: a pool child checks its
parent's, a solo worker its own. It is removed when the main process starts.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)


def flag_path(work_dir: Path, pid: int) -> Path:
    return work_dir / f".shutdown-{pid}"


def clear(work_dir: Path) -> None:
    """At start-up: no flag of an earlier process with this pid (pids are reused)."""
    flag_path(work_dir, os.getpid()).unlink(missing_ok=True)


def request(work_dir: Path) -> None:
    """Tell the job this worker runs to hand itself back (called in the worker's main process)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    flag_path(work_dir, os.getpid()).touch()
    logger.warning("worker %d is shutting down: its running job, if any, is handed back to the queue", os.getpid())


def requested(work_dir: Path) -> bool:
    """Whether this process's worker is shutting down (its own flag, or its parent's for a pool child)."""
    return flag_path(work_dir, os.getppid()).exists() or flag_path(work_dir, os.getpid()).exists()
