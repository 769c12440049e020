"""The fastest model within an accuracy budget as a job through the real worker: its targets and figures."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.core.settings import Settings
from tests.support.helpers import job_body, write_tiny_model
from tests.support.latency import seed_latency_table
from worker.runner import Outcome, WorkerContext, execute_job

BATCH, SEQ_LEN = 32, 16


def test_a_fastest_within_budget_job_reports_the_targets_it_tried_and_the_one_it_chose(
    client: TestClient, auth: dict[str, str], context: WorkerContext, settings: Settings, local_root: Path,
    dataset_uri: str,
) -> None:
    model_dir = write_tiny_model(local_root / "model")
    table = seed_latency_table(settings, model_dir, batch_size=BATCH, seq_len=SEQ_LEN)
    body = job_body(f"file://{model_dir}", dataset_uri, max_accuracy_drop=100.0, budget_objective="speed",
                    recovery="reconstruct", target_batch=BATCH, target_seq_len=SEQ_LEN, stability_shards=0,
                    latency_repeats=1)
    response = client.post("/v1/jobs", json=body, headers=auth)
    assert response.status_code == 202, response.text
    job_id = str(response.json()["id"])
    outcome = execute_job(job_id=job_id, context=context)
    job = client.get(f"/v1/jobs/{job_id}", headers=auth).json()
    assert outcome is Outcome.succeeded, job["error"]
    assert job["status"] == "succeeded" and job["params"]["budget_objective"] == "speed"
    manifest = {a["name"]: a for a in client.get(f"/v1/jobs/{job_id}/artifacts", headers=auth).json()["data"]}
    report = client.get(manifest["report.json"]["url"], headers=auth).json()
    budget, target = report["budget"], report["target"]
    # The ladder runs up to what the worker's table says is reachable, and the chosen target was cut on it.
    assert budget["targets"][-1] == math.floor(table.dense / table.floor * 100) / 100
    assert target["fit_error"] == table.fit_error
    assert target["reachable_speedup"] == pytest.approx(table.dense / table.floor)
    assert budget["objective"] == "speed" and budget["chosen_target"] == target["target"]
    tried = [c["target_speedup"] for c in budget["candidates"]]
    assert budget["chosen_target"] == max(tried) and set(tried) <= set(budget["targets"]) and not budget["skipped"]
    assert all(c["reconstructed"] is not None and c["measured_speedup"] is not None for c in budget["candidates"])
    assert job["result"]["heads_kept"] == sum(target["heads_per_layer"])
    logs = "\n".join(line["message"] for line in client.get(f"/v1/jobs/{job_id}/logs", headers=auth).json()["data"])
    assert "accuracy budget, the fastest model within 100 points" in logs and "chosen: target x" in logs
