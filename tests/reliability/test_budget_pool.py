"""An accuracy budget's candidates run across the worker pool, and a worker killed mid-candidate loses nothing.

Two real ``cahp worker`` processes (Celery's prefork pool) on the real Redis. One takes the budget job and
shares its candidates out as pieces; the other takes pieces. Once the second is training a piece, its pool
process is killed (SIGKILL): the piece's lease lapses, the piece is queued and sent again, and another
worker (or the search's own) runs it again from the same saved state. The job's answer is the one the same
search gives in one process, candidate by candidate. A cancelled budget job ends its pieces.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from app.core.params import run_config
from cahp_engine.data import DatasetOptions
from cahp_engine.run import RunRequest, run_pruning
from tests.support.budget_pool import BUDGET_PARAMS, budget_inputs, budget_pieces
from tests.support.helpers import TINY_PARAMS
from tests.support.stack import TERMINAL, Stack, holder_pid, kill

STACK_SETTINGS = {"max_attempts": 3, "checkpoint_interval_s": 0.0}
#: 150 training rows at batch 2: 75 steps an epoch. A learnt dense model, two head counts a round, and
#: pieces of 24 epochs evaluated only at their end (about 1,800 steps: seconds each on a tiny model).
def _submit(stack: Stack, **params: Any) -> str:
    model, data = budget_inputs(stack)
    body = {"model": {"uri": f"file://{model}"}, "dataset": {"uri": f"file://{data}"},
            "params": {**TINY_PARAMS, **BUDGET_PARAMS, **params}}
    response = stack.client.post("/v1/jobs", json=body)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def _wait_for_a_piece_elsewhere(stack: Stack, job_id: str, timeout: float) -> dict[str, Any]:
    """A piece running in another process than the job's, for at least a moment."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = stack.row(job_id)
        assert job["status"] not in TERMINAL, f"the job ended before a piece ran elsewhere: {job}"
        if job["status"] == "running":
            for piece in budget_pieces(stack, job_id):
                if piece["status"] == "running" and holder_pid(piece) != holder_pid(job):
                    time.sleep(0.3)
                    again = {p["id"]: p for p in budget_pieces(stack, job_id)}[piece["id"]]
                    if again["status"] == "running" and again["worker_id"] == piece["worker_id"]:
                        return again
        time.sleep(0.1)
    raise AssertionError(f"no piece ran outside the job's process: {budget_pieces(stack, job_id)}")


def test_candidates_run_across_two_workers_and_a_killed_workers_piece_is_run_again(stack: Stack,
                                                                                     tmp_path: Path) -> None:
    workers = [stack.start_worker(name, pool="prefork") for name in ("a", "b")]
    stack.wait_ready(*workers)
    job_id = _submit(stack)

    victim = _wait_for_a_piece_elsewhere(stack, job_id, timeout=300)
    kill(holder_pid(victim))
    done = stack.wait_row(job_id, lambda r: r["status"] in TERMINAL, timeout=600, what="the budget job to end")
    assert done["status"] == "succeeded" and done["attempts"] == 1, done

    pieces = budget_pieces(stack, job_id)
    again = next(p for p in pieces if p["id"] == victim["id"])
    assert again["status"] == "done" and again["attempts"] == 2 and again["worker_id"] != victim["worker_id"]
    assert all(p["status"] == "done" for p in pieces)
    # Pieces ran in more than one process: the job's own and at least one other (the killed one's claim
    # counts: whether the second worker's new process gets to a piece before the job's worker is a race).
    assert len({p["worker_id"] for p in pieces} | {victim["worker_id"]}) >= 2
    log = "\n".join(message for _, message in stack.logs(job_id))
    assert f"budget: piece {victim['id'][:8]} ran on worker" in log and "(run 2 times" in log

    # The same search in one process gives the same answer, candidate by candidate.
    model, data = budget_inputs(stack)
    config = run_config({**TINY_PARAMS, **BUDGET_PARAMS}, device="cpu")
    here = run_pruning(RunRequest(model_ref=model, dataset_ref=data, output_dir=tmp_path / "here", config=config,
                                  dataset_options=DatasetOptions()))
    report = stack.client.get(f"/v1/jobs/{job_id}/artifacts/report.json").json()
    assert report["summary"]["heads_kept"] == here.summary.heads_kept
    assert report["selection"]["kept"] == here.to_dict()["selection"]["kept"]

    def timeless(budget: dict[str, Any]) -> dict[str, Any]:
        budget = {k: v for k, v in budget.items()
                  if k not in ("search_seconds", "final_recovery_seconds", "cost_vs_single_run")}
        budget["candidates"] = [{k: v for k, v in c.items() if k != "seconds"} for c in budget["candidates"]]
        return budget

    assert timeless(report["budget"]) == timeless(here.budget.to_dict())
    assert len({c["round"] for c in report["budget"]["candidates"]}) >= 1


def test_cancelling_a_budget_job_ends_its_pieces(stack: Stack) -> None:
    # Workers of its own, whatever ran before in this module (the first test kills a process of its
    # workers): two fresh processes free to take the pieces the job's worker sends out.
    workers = [stack.start_worker(name, pool="prefork") for name in ("c", "d")]
    stack.wait_ready(*workers)
    # Pieces ten times as long as the other tests': one is surely still running in the other worker when
    # looked at, however slow or fast the machine (the job is cancelled, so they never run to their end).
    job_id = _submit(stack, seed=6, epochs=480, budget_screen_epochs=240.0)
    _wait_for_a_piece_elsewhere(stack, job_id, timeout=300)
    assert stack.client.post(f"/v1/jobs/{job_id}/cancel").status_code == 202
    ended = stack.wait_row(job_id, lambda r: r["status"] in TERMINAL, timeout=120, what="the job to be cancelled")
    assert ended["status"] == "cancelled"
    # No piece is left running or waiting: none would be taken (the job is over) and none holds a worker.
    stack.wait_row(job_id, lambda _r: all(p["status"] in ("done", "cancelled") for p in budget_pieces(stack, job_id)),
                   timeout=60, what="the pieces to end")
