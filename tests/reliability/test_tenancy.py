"""Quotas and fairness per key, replayed on a real ``cahp serve`` and real ``cahp worker`` processes.

One key holding the service: more jobs than its quota, more open event streams, more stored upload
bytes, a budget wider than the server allows; and one key's backlog, cancelled or not, standing before
another key's tiny job. Fairness is counted, not timed: how many of key B's jobs start before key A's.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from app.core.db import BudgetPiece
from tests.support.helpers import new_key
from tests.support.processes import stop, wait_for
from tests.support.stack import TERMINAL, Server, Stack, start_server

#: The cancelled backlog: the one that took another key's job minutes to get past.
CANCELLED_BACKLOG = 150
#: Jobs of B queued (and run) before A's one.
RUNNING_BACKLOG = 5
STACK_SETTINGS: dict[str, Any] = {"max_active_jobs_per_key": 1000}
TINY = {"epochs": 1, "dense_finetune": "never", "untrained_dense": "warn", "batch_size": 16, "max_length": 32,
        "seed": 0, "export": "none",
        "latency_repeats": 1}


def _body(stack: Stack, **params: Any) -> dict[str, Any]:
    model, data = stack.inputs()
    return {"model": {"uri": model}, "dataset": {"uri": data}, "params": {**TINY, **params}}


@pytest.fixture(scope="module")
def server(stack: Stack) -> Iterator[Server]:
    """``cahp serve`` (no worker of its own) on the stack's database and queue, with small quotas."""
    served = start_server(stack.settings, stack.root / "serve.log", max_active_jobs_per_key=3,
                          max_event_streams_per_key=2, max_upload_bytes_per_key=6000, max_budget_parallel=4,
                          events_poll_s=0.2)
    try:
        yield served
    finally:
        stop(served.process, grace_s=10)


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _assert_quota(response: httpx.Response, code: str, setting: str, limit: int) -> None:
    assert response.status_code == 429, response.text
    problem = response.json()
    assert problem["code"] == code and problem["setting"] == setting and problem["limit"] == limit, problem
    assert f"{setting}={limit}" in problem["detail"] or str(limit) in problem["detail"]
    assert int(response.headers["retry-after"]) > 0


def test_a_key_past_its_quotas_is_answered_429_naming_the_limit(stack: Stack, server: Server) -> None:
    key_a, key_b = new_key(stack.engine, "quota-a"), new_key(stack.engine, "quota-b")
    with httpx.Client(base_url=server.url, headers=_bearer(key_a), timeout=60) as a:
        # Queued plus running jobs: three, then 429; another key is not held by A's quota.
        queued = []
        for _ in range(3):
            response = a.post("/v1/jobs", json=_body(stack))
            assert response.status_code == 202, response.text
            queued.append(response.json()["id"])
        _assert_quota(a.post("/v1/jobs", json=_body(stack)), "too_many_active_jobs",
                      "CAHP_MAX_ACTIVE_JOBS_PER_KEY", 3)
        theirs = httpx.post(f"{server.url}/v1/jobs", json=_body(stack), headers=_bearer(key_b), timeout=60)
        assert theirs.status_code == 202, theirs.text
        other = theirs.json()["id"]
        # A cancelled job leaves the quota at once.
        assert a.post(f"/v1/jobs/{queued[0]}/cancel").status_code == 202
        replacement = a.post("/v1/jobs", json=_body(stack))
        assert replacement.status_code == 202, replacement.text

        # Open event streams: two held open on a queued job, the third refused; one closed frees its slot.
        with a.stream("GET", f"/v1/jobs/{queued[1]}/events") as first, \
                a.stream("GET", f"/v1/jobs/{queued[1]}/events") as second:
            assert first.status_code == second.status_code == 200
            # Read through iterators kept alive: a dropped one closes its stream (the client disconnects).
            held = [first.iter_bytes(), second.iter_bytes()]
            assert all(next(chunks).startswith(b"retry:") for chunks in held)
            third = a.get(f"/v1/jobs/{queued[2]}/events")
            _assert_quota(third, "too_many_event_streams", "CAHP_MAX_EVENT_STREAMS_PER_KEY", 2)
        # The server notices the closed streams as it next writes to them: wait for a slot, then hold it.
        wait_for(lambda: _opens(a, f"/v1/jobs/{queued[2]}/events"), timeout=60, what="a stream slot to free up")

        # Stored upload bytes: 4,000 fit, 4,000 more do not; the refused upload leaves no row behind.
        first_file = ("text,label\n" + "a fine film,1\n" * 285).encode()
        other_file = ("text,label\n" + "a dull film,0\n" * 285).encode()
        stored = a.post("/v1/uploads", files={"file": ("one.csv", first_file)})
        assert stored.status_code == 201, stored.text
        refused = a.post("/v1/uploads", files={"file": ("two.csv", other_file)})
        _assert_quota(refused, "upload_quota_exceeded", "CAHP_MAX_UPLOAD_BYTES_PER_KEY", 6000)
        assert a.get(f"/v1/uploads/sha256:{hashlib.sha256(other_file).hexdigest()}").status_code == 404
        # The same bytes again cost nothing: the upload the key has.
        assert a.post("/v1/uploads", files={"file": ("one.csv", first_file)}).status_code == 200

        # A budget wider than the server allows is refused at submit, naming the setting.
        wide = a.post("/v1/jobs/check", json=_body(stack, max_accuracy_drop=2.0, budget_parallel=64))
        assert wide.status_code == 422 and wide.json()["code"] == "budget_parallel_over_limit", wide.text
        assert "CAHP_MAX_BUDGET_PARALLEL" in wide.json()["detail"] and "64" in wide.json()["detail"]
        # Nothing of this test is left queued for the tests after it.
        for job_id in [*queued[1:], replacement.json()["id"]]:
            assert a.post(f"/v1/jobs/{job_id}/cancel").status_code == 202
    assert httpx.post(f"{server.url}/v1/jobs/{other}/cancel", headers=_bearer(key_b), timeout=60).status_code == 202


def _opens(client: httpx.Client, path: str) -> bool:
    with client.stream("GET", path) as response:
        if response.status_code == 429:
            return False
        assert response.status_code == 200, response.read()
        return next(response.iter_bytes()).startswith(b"retry:")


def _task_results(log: str) -> list[str]:
    """What each job task the worker ran returned, in order (Celery's ``succeeded in ...: 'outcome'`` lines)."""
    return re.findall(r"Task cahp\.run_job\[[^\]]+\] succeeded in [0-9.e-]+s: '(\w+)'", log)


def test_a_cancelled_backlog_of_one_key_does_not_stand_before_another_keys_job(stack: Stack, tmp_path: Path) -> None:
    key_b = new_key(stack.engine, "backlog-b")
    b = {"headers": _bearer(key_b)}
    backlog = []
    for _ in range(CANCELLED_BACKLOG):
        response = stack.client.post("/v1/jobs", json=_body(stack), **b)  # type: ignore[arg-type]
        assert response.status_code == 202, response.text
        backlog.append(response.json()["id"])
    for job_id in backlog:
        assert stack.client.post(f"/v1/jobs/{job_id}/cancel", **b).status_code == 202  # type: ignore[arg-type]
    mine = stack.submit(**TINY)

    worker = stack.start_worker("cancelled-backlog")
    stack.wait_ready(worker)
    done = stack.wait_row(mine, lambda r: r["status"] in TERMINAL, timeout=300, what="A's job to end")
    assert done["status"] == "succeeded", done
    # The first message the worker took (a cancelled job's) started A's job: nothing was drained first. The
    # row says succeeded before Celery logs the task's return: wait for that line.
    wait_for(lambda: "succeeded" in _task_results(worker.output()), timeout=60, what="the task's result in the log",
             log=worker.log)
    results = _task_results(worker.output())
    assert results.index("succeeded") == 0, results[:10]
    stop(worker.process, grace_s=10)
    stack.workers.remove(worker)


def test_a_backlog_of_one_key_holds_another_keys_job_back_by_one_job_at_most(stack: Stack) -> None:
    key_b = new_key(stack.engine, "running-b")
    b = {"headers": _bearer(key_b)}
    backlog = []
    for _ in range(RUNNING_BACKLOG):
        response = stack.client.post("/v1/jobs", json=_body(stack), **b)  # type: ignore[arg-type]
        assert response.status_code == 202, response.text
        backlog.append(response.json()["id"])
    mine = stack.submit(**TINY)

    worker = stack.start_worker("running-backlog")
    stack.wait_ready(worker)
    done = stack.wait_row(mine, lambda r: r["status"] in TERMINAL, timeout=600, what="A's job to end")
    assert done["status"] == "succeeded", done
    started_before = [j for j in backlog
                      if (row := stack.row(j))["started_at"] is not None and row["started_at"] < done["started_at"]]
    # One slot: at most the one job of B that held it when A's job came due.
    assert len(started_before) <= 1, (len(started_before), RUNNING_BACKLOG)
    for job_id in backlog:
        stack.client.post(f"/v1/jobs/{job_id}/cancel", **b)  # type: ignore[arg-type]


def test_a_budgets_pieces_hold_another_keys_job_back_by_one_piece_at_most(stack: Stack) -> None:
    from tests.support.budget_pool import BUDGET_PARAMS, budget_inputs, budget_pieces
    from tests.support.helpers import TINY_PARAMS

    key_b = new_key(stack.engine, "budget-b")
    model, data = budget_inputs(stack)
    body = {"model": {"uri": f"file://{model}"}, "dataset": {"uri": f"file://{data}"},
            "params": {**TINY_PARAMS, **BUDGET_PARAMS, "budget_parallel": 8}}
    workers = [stack.start_worker(name) for name in ("search", "pool")]
    stack.wait_ready(*workers)
    response = stack.client.post("/v1/jobs", json=body, headers=_bearer(key_b))
    assert response.status_code == 202, response.text
    budget = response.json()["id"]
    # A round's pieces wait in the queue, and one already runs outside the search's own worker.
    stack.wait_row(budget, lambda r: r["status"] == "running" and any(
        p["status"] == "running" and p["worker_id"] != r["worker_id"] for p in budget_pieces(stack, budget))
        and sum(p["status"] == "queued" for p in budget_pieces(stack, budget)) >= 2,
        timeout=300, what="pieces queued and one running elsewhere")
    mine = stack.submit(**TINY)
    queued_then = {p["id"] for p in budget_pieces(stack, budget) if p["status"] == "queued"}
    done = stack.wait_row(mine, lambda r: r["status"] in TERMINAL, timeout=600, what="A's job to end")
    assert done["status"] == "succeeded", done
    search_worker = stack.row(budget)["worker_id"]
    # Pieces the pool ran from start to end between A's submit and A's start: the one a worker had
    # already taken when A came is the most that may stand before it.
    with stack.sessions() as session:
        rows = session.scalars(select(BudgetPiece).where(BudgetPiece.job_id == budget)).all()
        before = [p.id for p in rows if p.id in queued_then and p.status == "done" and p.worker_id != search_worker
                  and p.updated_at < done["started_at"]]
    assert len(before) <= 1, before
    assert stack.client.post(f"/v1/jobs/{budget}/cancel", headers=_bearer(key_b)).status_code == 202
    for worker in workers:
        stop(worker.process, grace_s=10)
        stack.workers.remove(worker)
