"""The broker delivers a running job's message a second time, as Redis does after its visibility timeout.

Two ``cahp worker`` processes consume one queue. The message is taken from Redis's own record of
unacknowledged deliveries and pushed back onto the queue, exactly as kombu restores it. While the
first worker's lease is alive the second delivery does nothing; once the first worker is killed
and its lease has run out, the next delivery takes the job over and runs it again from the start.
The sweeper is off here, so the redelivery is the only way the job can move on.
"""

from __future__ import annotations

import datetime as dt
import json

import redis

from tests.support.processes import wait_for
from tests.support.stack import SLOW_EPOCHS, TERMINAL, Stack, Worker, holder_pid, kill

STACK_SETTINGS = {"sweep_interval_s": 0.0}


def _delivered_message(stack: Stack, job_id: str) -> str:
    """The job's message as Redis keeps it while unacknowledged (the copy kombu restores from).

    A copy carries the same delivery tag, so acknowledging a copy removes the record: it is read
    once, before any redelivery.
    """
    from app.api.background import job_id_of

    client = redis.Redis.from_url(str(stack.settings.broker_url))
    try:
        for raw in client.hvals("unacked"):
            message, _exchange, routing_key = json.loads(raw)
            if routing_key == stack.settings.queue and job_id_of(json.dumps(message)) == job_id:
                message["headers"]["redelivered"] = True
                return json.dumps(message)
    finally:
        client.close()
    raise AssertionError(f"no unacknowledged message for job {job_id} in Redis")


def _redeliver(stack: Stack, message: str) -> None:
    client = redis.Redis.from_url(str(stack.settings.broker_url))
    try:
        client.lpush(stack.settings.queue, message)
    finally:
        client.close()


def _by_pid(workers: list[Worker], pid: int) -> Worker:
    return next(w for w in workers if w.process.pid == pid)


def test_a_second_delivery_waits_for_a_live_lease_and_takes_over_a_dead_one(stack: Stack) -> None:
    workers = [stack.start_worker("first"), stack.start_worker("second")]
    stack.wait_ready(*workers)
    job_id = stack.submit(epochs=SLOW_EPOCHS, batch_size=2)
    running = stack.wait_row(job_id, lambda r: r["stage"] == "recovery" or r["status"] in TERMINAL, timeout=180,
                             what="the job to be fine-tuning")
    assert running["status"] == "running", running
    holder = _by_pid(workers, holder_pid(running))
    other = next(w for w in workers if w is not holder)

    message = _delivered_message(stack, job_id)
    _redeliver(stack, message)
    wait_for(lambda: f"job {job_id} is held by {running['worker_id']}" in other.output(), timeout=60,
             what="the other worker to receive the second delivery", log=other.log)
    still = stack.row(job_id)
    assert (still["status"], still["attempts"], still["worker_id"]) == ("running", 1, running["worker_id"])

    kill(holder.process.pid)
    holder.process.wait()
    # Nothing moves the job while nothing delivers it: it stays running until its lease is over.
    expired = stack.wait_row(
        job_id, lambda r: r["lease_expires_at"] < dt.datetime.now(dt.UTC), timeout=60,
        what="the dead worker's lease to expire")
    assert (expired["status"], expired["attempts"]) == ("running", 1)

    _redeliver(stack, message)
    done = stack.wait_row(job_id, lambda r: r["status"] in TERMINAL, timeout=240, what="the taken-over job to end")
    assert done["status"] == "succeeded" and done["attempts"] == 2, done
    assert holder_pid(done) == other.process.pid
    keys = stack.artifact_keys(job_id)
    assert keys and all(key.startswith(f"jobs/{job_id}/2/") for key in keys), keys
    lines = stack.logs(job_id)
    assert [n for n, _ in lines] == list(range(len(lines)))
    assert sum("attempt 2 on worker" in m for _, m in lines) == 1
