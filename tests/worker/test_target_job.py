"""A job pruned to a target through the real worker: its figures in the stored report, an unreachable one's code."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from tests.support.helpers import job_body
from worker.runner import Outcome, WorkerContext, execute_job


def _submit(client: TestClient, auth: dict[str, str], body: dict[str, Any]) -> str:
    response = client.post("/v1/jobs", json=body, headers=auth)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def test_a_flops_target_job_runs_end_to_end_with_its_figures_in_the_report(
    client: TestClient, auth: dict[str, str], context: WorkerContext, model_uri: str, dataset_uri: str,
) -> None:
    job_id = _submit(client, auth, job_body(model_uri, dataset_uri, target_flops=0.5, target_seq_len=16,
                                            stability_shards=0, recovery="reconstruct", latency_repeats=1))
    assert execute_job(job_id=job_id, context=context) is Outcome.succeeded
    job = client.get(f"/v1/jobs/{job_id}", headers=auth).json()
    assert job["status"] == "succeeded" and job["params"]["target_flops"] == 0.5
    manifest = {a["name"]: a for a in client.get(f"/v1/jobs/{job_id}/artifacts", headers=auth).json()["data"]}
    report = client.get(manifest["report.json"]["url"], headers=auth).json()
    target = report["target"]
    assert target["kind"] == "flops" and target["flops_kept"] <= 0.5 and target["predicted_speedup"] >= 2.0
    assert len(target["heads_per_layer"]) == len(target["neurons_per_layer"]) == report["model"]["layers"]
    assert sum(target["neurons_per_layer"]) < report["model"]["layers"] * target["neurons_total"]
    assert report["parameters"]["pruned"]["total"] < report["parameters"]["dense"]["total"]
    assert [len(report["selection"]["kept"][str(layer)]) for layer in range(report["model"]["layers"])] == \
        target["heads_per_layer"]
    assert job["result"]["heads_kept"] == sum(target["heads_per_layer"])
    logs = "\n".join(line["message"] for line in
                     client.get(f"/v1/jobs/{job_id}/logs", headers=auth).json()["data"])
    assert "FLOPs target 0.5: kept" in logs and "neurons (of " in logs


def test_an_unreachable_target_fails_the_job_with_its_code_and_the_reachable_one(
    client: TestClient, auth: dict[str, str], context: WorkerContext, model_uri: str, dataset_uri: str,
) -> None:
    job_id = _submit(client, auth, job_body(model_uri, dataset_uri, target_speedup=900.0, target_seq_len=16))
    assert execute_job(job_id=job_id, context=context) is Outcome.failed
    job = client.get(f"/v1/jobs/{job_id}", headers=auth).json()
    assert job["status"] == "failed" and job["error"]["code"] == "target_unreachable"
    assert "beyond what this model reaches" in job["error"]["message"]
    assert "ask for at most" in job["error"]["message"]
