"""The fastest model within an accuracy budget as a job through the real worker: its targets and figures."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.support.helpers import job_body
from worker.runner import Outcome, WorkerContext, execute_job


def test_a_fastest_within_budget_job_reports_the_targets_it_tried_and_the_one_it_chose(
    client: TestClient, auth: dict[str, str], context: WorkerContext, model_uri: str, dataset_uri: str,
) -> None:
    body = job_body(model_uri, dataset_uri, max_accuracy_drop=100.0, budget_objective="speed", recovery="reconstruct",
                    target_seq_len=16, stability_shards=0, latency_repeats=1)
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
    assert budget["objective"] == "speed" and budget["chosen_target"] == target["target"]
    tried = [c["target_speedup"] for c in budget["candidates"]]
    assert budget["chosen_target"] == max(tried) and set(tried) <= set(budget["targets"])
    assert all(c["reconstructed"] is not None and c["measured_speedup"] is not None for c in budget["candidates"])
    assert job["result"]["heads_kept"] == sum(target["heads_per_layer"])
    logs = "\n".join(line["message"] for line in client.get(f"/v1/jobs/{job_id}/logs", headers=auth).json()["data"])
    assert "accuracy budget, the fastest model within 100 points" in logs and "chosen: target x" in logs
