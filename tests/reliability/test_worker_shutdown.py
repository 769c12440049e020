"""A worker told to stop (SIGTERM, as a redeploy does) hands its running job back at once.

Real ``cahp worker`` processes (Celery's prefork pool) on the real Redis. The lease is long and no
sweeper runs, so the job can move only because the stopping worker gave it back and sent its message
again: the next worker takes it within seconds, not after the lease, and goes on from the step at
which the first stopped (saved as it stopped).
"""

from __future__ import annotations

import json
import re
import signal

from tests.support.processes import wait_for
from tests.support.stack import TERMINAL, Stack

#: No sweeper and a lease of ten minutes: nothing but the hand-back can move the job during the test.
STACK_SETTINGS = {"lease_s": 600.0, "heartbeat_interval_s": 20.0, "sweep_interval_s": 0.0,
                  "requeue_after_s": 3600.0, "checkpoint_interval_s": 0.0}


def _saved(stack: Stack, job_id: str) -> bool:
    path = stack.settings.data_dir / "artifacts" / "jobs" / job_id / "checkpoints" / "index.json"
    try:
        return "recovery_training" in json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return False


def test_sigterm_hands_the_running_job_back_and_another_worker_resumes_it_at_once(stack: Stack) -> None:
    first = stack.start_worker("first", pool="prefork")
    stack.wait_ready(first)
    job_id = stack.submit(epochs=1000, batch_size=2)  # never ends by itself
    running = stack.wait_row(job_id, lambda r: r["stage"] == "recovery" and _saved(stack, job_id)
                             or r["status"] in TERMINAL, timeout=240, what="the job to save a recovery epoch")
    assert running["status"] == "running" and running["attempts"] == 1, running

    first.process.send_signal(signal.SIGTERM)  # the worker's main process, as `docker stop` signals it
    handed = stack.wait_row(job_id, lambda r: r["status"] != "running", timeout=120, what="the job to be handed back")
    assert handed["status"] == "queued" and handed["attempts"] == 0, handed  # the attempt is given back
    assert handed["worker_id"] is None and handed["lease_expires_at"] is None and handed["enqueued_at"] is not None
    assert first.process.wait(timeout=120) == 0  # and the worker then stops
    text = "\n".join(message for _, message in stack.logs(job_id))
    assert "is shutting down: attempt 1 is handed back to the queue" in text
    # It saved recovery at the last step it took, not only at the last epoch's end.
    stopped = re.search(r"recovery: stopped at step (\d+); its state is saved for the next attempt", text)
    assert stopped is not None, text

    # The message the stopping worker sent: a new worker takes the job long before any lease could lapse.
    second = stack.start_worker("second", pool="prefork")
    resumed = stack.wait_row(job_id, lambda r: r["status"] == "running" and r["stage"] == "recovery", timeout=240,
                             what="another worker to take the job")
    assert resumed["attempts"] == 1 and resumed["worker_id"] != running["worker_id"]
    going_on = f"recovery: going on from step {stopped.group(1)} (saved by an earlier attempt)"
    stack.wait_row(job_id, lambda r: going_on in "\n".join(m for _, m in stack.logs(job_id)),
                   timeout=120, what="the new attempt to resume recovery")
    text = "\n".join(message for _, message in stack.logs(job_id))
    assert "resuming from the checkpoints of an earlier attempt" in text.split("is handed back to the queue")[1]

    assert stack.client.post(f"/v1/jobs/{job_id}/cancel").status_code == 202
    stack.wait_row(job_id, lambda r: r["status"] in TERMINAL, timeout=120, what="the job to be cancelled")
    # A job that ended keeps no resume state (removed just after its end is committed).
    wait_for(lambda: not _saved(stack, job_id), timeout=60, what="the ended job's resume state to be removed")
    # The job's history: the handed-back attempt, and the next one going on from the step it saved.
    attempts = stack.client.get(f"/v1/jobs/{job_id}").json()["attempts"]
    assert [(a["number"], a["worker"], a["end"]) for a in attempts] == \
        [(1, running["worker_id"], "handed_back"), (2, resumed["worker_id"], "cancelled")], attempts
    assert attempts[0]["resumed_from"] is None
    assert attempts[1]["resumed_from"] == f"recovery_training step {stopped.group(1)}", attempts
    stack.wait_ready(second)
