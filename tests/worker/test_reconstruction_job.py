"""A job whose recovery is layer-wise reconstruction, through the real worker and the real engine.

The reconstruction is a stage a client sees: the job's stage (what the event stream sends) reads
``reconstruction`` while it runs, the job's log says what it did, and report.json records it.
"""

from __future__ import annotations

import dataclasses

from fastapi.testclient import TestClient

from cahp_engine.run import RunHooks, RunReport, RunRequest, run_pruning
from tests.support.helpers import job_body
from worker.runner import Outcome, WorkerContext, execute_job


def test_a_reconstruct_job_shows_the_stage_logs_it_and_records_it(
    client: TestClient, auth: dict[str, str], context: WorkerContext, model_uri: str, dataset_uri: str,
) -> None:
    response = client.post("/v1/jobs", json=job_body(model_uri, dataset_uri, recovery="reconstruct"), headers=auth)
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]
    seen: list[str | None] = []

    def watched_run(request: RunRequest, hooks: RunHooks) -> RunReport:
        progress = hooks.progress
        assert progress is not None

        def watch(stage: str, fraction: float) -> None:
            progress(stage, fraction)
            if stage == "reconstruction":
                seen.append(client.get(f"/v1/jobs/{job_id}", headers=auth).json()["stage"])

        return run_pruning(request, dataclasses.replace(hooks, progress=watch))

    assert execute_job(job_id=job_id, context=context, pipeline=watched_run) is Outcome.succeeded
    assert seen and set(seen) == {"reconstruction"}  # the job's stage while the engine reconstructed
    logs = "\n".join(line["message"] for line in
                     client.get(f"/v1/jobs/{job_id}/logs", headers=auth).json()["data"])
    assert "layer-wise reconstruction (ridge, residual target, feed-forward residual)" in logs
    assert "recovery fine-tuning: none" in logs
    manifest = {a["name"]: a for a in client.get(f"/v1/jobs/{job_id}/artifacts", headers=auth).json()["data"]}
    report = client.get(manifest["report.json"]["url"], headers=auth).json()
    assert report["config"]["recovery"] == "reconstruct" and report["recovery"]["steps"] == 0
    assert report["reconstruction"]["fits"] and "reconstruction" in report["timings_s"]
    assert all(f["error_after"] < f["error_before"] for f in report["reconstruction"]["fits"])
