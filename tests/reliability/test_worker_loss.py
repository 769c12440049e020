"""A worker process killed with SIGKILL while it fine-tunes: the job is taken over, or fails as worker_lost.

The worker is a real ``cahp worker`` (Celery's prefork pool): the job runs in a child process, and
that child is the one killed, at the moment the job row says it is in the recovery fine-tuning. The
API's sweeper (running in this process, as in ``cahp serve``) notices the expired lease.
"""

from __future__ import annotations

import hashlib

from tests.support.stack import SLOW_EPOCHS, TERMINAL, Stack, holder_pid, kill

STACK_SETTINGS = {"max_attempts": 2}


def _fine_tuning(stack: Stack, job_id: str, attempt: int) -> dict:
    return stack.wait_row(
        job_id, lambda r: r["attempts"] == attempt and r["stage"] == "recovery" or r["status"] in TERMINAL,
        timeout=180, what=f"attempt {attempt} of job {job_id} to be fine-tuning")


def test_a_job_whose_process_is_killed_is_taken_over_and_only_the_new_attempt_is_served(stack: Stack) -> None:
    worker = stack.start_worker("prefork", pool="prefork")
    stack.wait_ready(worker)
    job_id = stack.submit(epochs=SLOW_EPOCHS, batch_size=2)
    first = _fine_tuning(stack, job_id, 1)
    assert first["status"] == "running", f"the job ended before it could be killed: {first}"
    kill(holder_pid(first))

    # Within the configured bound (lease + one sweep, plus time to start again), a new attempt holds it.
    bound = stack.settings.takeover_bound_s
    second = stack.wait_row(job_id, lambda r: r["attempts"] == 2 or r["status"] in TERMINAL, timeout=bound + 60,
                            what="the job to be taken over")
    assert second["worker_id"] != first["worker_id"]
    done = stack.wait_row(job_id, lambda r: r["status"] in TERMINAL, timeout=240, what="the second attempt to end")
    assert done["status"] == "succeeded" and done["attempts"] == 2, done

    # Everything served comes from attempt 2, and nothing of attempt 1 is in the store.
    keys = stack.artifact_keys(job_id)
    assert keys and all(key.startswith(f"jobs/{job_id}/2/") for key in keys), keys
    store_root = stack.settings.data_dir / "artifacts" / "jobs" / job_id
    assert sorted(p.name for p in store_root.iterdir()) == ["2"]
    for entry in stack.client.get(f"/v1/jobs/{job_id}/artifacts").json()["data"]:
        body = stack.client.get(entry["url"]).content
        assert hashlib.sha256(body).hexdigest() == entry["sha256"], entry["name"]

    # One log, numbered without gaps or repeats, telling both attempts.
    lines = stack.logs(job_id)
    assert [n for n, _ in lines] == list(range(len(lines)))
    text = "\n".join(m for _, m in lines)
    assert f"attempt 1 on worker {first['worker_id']}" in text and "attempt 2 on worker" in text


def test_a_job_whose_worker_dies_on_every_attempt_fails_as_worker_lost(stack: Stack) -> None:
    if not stack.workers:
        stack.wait_ready(stack.start_worker("prefork", pool="prefork"))
    job_id = stack.submit(epochs=1000, batch_size=2)  # never finishes by itself
    index = stack.settings.data_dir / "artifacts" / "jobs" / job_id / "checkpoints" / "index.json"
    for attempt in (1, 2):
        row = _fine_tuning(stack, job_id, attempt)
        assert row["status"] == "running", row
        if attempt == 1:  # an epoch saved, for the sweeper to remove when it ends the job
            row = stack.wait_row(job_id, lambda r: index.exists() and "recovery_training" in index.read_text(),
                                 timeout=120, what="a recovery's saved state")
        kill(holder_pid(row))
    failed = stack.wait_row(job_id, lambda r: r["status"] != "running" and r["attempts"] == 2,
                            timeout=stack.settings.takeover_bound_s + 60, what="the job to fail")
    assert failed["status"] == "failed" and failed["error_code"] == "worker_lost", failed
    assert "CAHP_MAX_ATTEMPTS" in failed["error_message"] and failed["finished_at"] is not None
    assert failed["worker_id"] is None and failed["lease_expires_at"] is None
    job = stack.client.get(f"/v1/jobs/{job_id}").json()
    assert job["status"] == "failed" and job["error"]["code"] == "worker_lost"
    assert stack.artifact_keys(job_id) == []
    # The sweeper that ended it removed the resume state its attempts saved.
    assert not (stack.settings.data_dir / "artifacts" / "jobs" / job_id / "checkpoints").exists()
