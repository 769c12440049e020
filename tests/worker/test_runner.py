"""execute_job with the real engine: success, re-delivery, cancellation, failures, time limit."""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from sqlalchemy import text, update
from sqlalchemy.orm import Session, sessionmaker

from app.core.db import Job, repository, transaction
from app.core.settings import Settings
from app.core.storage import open_store
from cahp_engine.models import load_pruned
from cahp_engine.run import ARTIFACT_FILES, RunHooks, RunReport, RunRequest, run_pruning
from tests.support.fragile import write_fragile_model
from tests.support.helpers import job_body, write_split, write_tiny_dataset
from worker.runner import Outcome, WorkerContext, execute_job


def _submit(client: TestClient, auth: dict[str, str], body: dict[str, Any]) -> str:
    response = client.post("/v1/jobs", json=body, headers=auth)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def _job(client: TestClient, auth: dict[str, str], job_id: str) -> dict[str, Any]:
    result: dict[str, Any] = client.get(f"/v1/jobs/{job_id}", headers=auth).json()
    return result


def _logs(client: TestClient, auth: dict[str, str], job_id: str) -> str:
    return "\n".join(line["message"] for line in client.get(f"/v1/jobs/{job_id}/logs", headers=auth).json()["data"])


def test_a_job_runs_to_success_and_stores_every_artifact(
    client: TestClient, auth: dict[str, str], context: WorkerContext, model_uri: str, dataset_uri: str,
    settings: Settings, tmp_path: Path,
) -> None:
    job_id = _submit(client, auth, job_body(model_uri, dataset_uri, export="onnx", quantize="int8",
                                            latency_repeats=2))
    assert execute_job(job_id=job_id, context=context) is Outcome.succeeded
    job = _job(client, auth, job_id)
    assert job["status"] == "succeeded" and job["progress"] == 1.0 and job["error"] is None
    assert job["started_at"] and job["finished_at"] and job["stage"] == "artifacts"
    assert job["result"]["heads_total"] == 8 and 1 <= job["result"]["heads_kept"] <= 8
    assert 0.0 <= job["result"]["pruned_accuracy"] <= 1.0
    manifest = client.get(f"/v1/jobs/{job_id}/artifacts", headers=auth).json()["data"]
    assert {a["name"] for a in manifest} == {"model.tar.gz", "onnx.tar.gz", "onnx-int8.tar.gz", *ARTIFACT_FILES}
    assert job["result"]["onnx_max_abs_diff"] <= 1e-4 and job["result"]["onnx_speedup"] > 0
    assert 0.0 <= job["result"]["int8_accuracy"] <= 1.0 and job["result"]["int8_speedup"] > 0
    store = open_store(settings)
    for entry in manifest:
        body = client.get(entry["url"], headers=auth).content
        assert hashlib.sha256(body).hexdigest() == entry["sha256"] and len(body) == entry["size"]
    archive = tmp_path / "model.tar.gz"
    archive.write_bytes(client.get(f"/v1/jobs/{job_id}/artifacts/model.tar.gz", headers=auth).content)
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    model = load_pruned(tmp_path / "unpacked" / "model")
    assert sum(1 for _ in model.parameters()) > 0
    assert "attempt 1" in _logs(client, auth, job_id)
    assert not (settings.resolved_work_dir / f"{job_id}.1").exists()  # scratch space is cleaned up
    assert store.exists(f"jobs/{job_id}/1/model.tar.gz")
    # The ONNX directory serves without cahp: onnxruntime and the saved tokenizer, logits as PyTorch's.
    import numpy as np
    import onnxruntime
    from transformers import AutoTokenizer

    archive = tmp_path / "onnx.tar.gz"
    archive.write_bytes(client.get(f"/v1/jobs/{job_id}/artifacts/onnx.tar.gz", headers=auth).content)
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "served", filter="data")
    served = tmp_path / "served" / "onnx"
    tokenizer = AutoTokenizer.from_pretrained(served)
    session = onnxruntime.InferenceSession(str(served / "model.onnx"))
    texts = ["a fine film", "dull and long, a waste of an evening"]
    feed = dict(tokenizer(texts, padding=True, return_tensors="np"))
    feed = {i.name: feed[i.name].astype(np.int64) for i in session.get_inputs()}
    with torch.no_grad():
        expected = model(**tokenizer(texts, padding=True, return_tensors="pt")).logits.numpy()
    assert np.abs(session.run(["logits"], feed)[0] - expected).max() <= 1e-4
    assert (served / "README.md").read_text().count("onnxruntime") >= 1


def test_a_second_delivery_of_a_finished_or_cancelled_job_does_nothing(
    client: TestClient, auth: dict[str, str], context: WorkerContext, model_uri: str, dataset_uri: str,
    sessions: sessionmaker[Session],
) -> None:
    done = _submit(client, auth, job_body(model_uri, dataset_uri))
    assert execute_job(job_id=done, context=context) is Outcome.succeeded
    assert execute_job(job_id=done, context=context) is Outcome.skipped
    with sessions() as session:
        assert len(repository.list_artifacts(session, job_id=done)) == 1 + len(ARTIFACT_FILES)
        assert session.get(Job, done).attempts == 1  # type: ignore[union-attr]
    cancelled = _submit(client, auth, job_body(model_uri, dataset_uri))
    client.post(f"/v1/jobs/{cancelled}/cancel", headers=auth)
    assert execute_job(job_id=cancelled, context=context) is Outcome.skipped
    assert _job(client, auth, cancelled)["started_at"] is None
    assert execute_job(job_id="no-such-job", context=context) is Outcome.skipped


def test_two_simultaneous_deliveries_run_the_job_once(
    client: TestClient, auth: dict[str, str], context: WorkerContext, model_uri: str, dataset_uri: str,
) -> None:
    job_id = _submit(client, auth, job_body(model_uri, dataset_uri))
    outcomes: list[Outcome] = []
    barrier = threading.Barrier(2)

    def deliver(worker_id: str) -> None:
        barrier.wait()
        ctx = WorkerContext(settings=context.settings, sessions=context.sessions, store=context.store,
                            worker_id=worker_id)
        outcomes.append(execute_job(job_id=job_id, context=ctx))

    threads = [threading.Thread(target=deliver, args=(f"w{i}",)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == sorted([Outcome.succeeded, Outcome.skipped])
    assert _job(client, auth, job_id)["status"] == "succeeded"


def test_a_cancel_request_stops_a_running_job_between_steps(
    client: TestClient, auth: dict[str, str], context: WorkerContext, model_uri: str, dataset_uri: str,
) -> None:
    job_id = _submit(client, auth, job_body(model_uri, dataset_uri, epochs=50))
    stages: list[str] = []

    def cancelling_run(request: RunRequest, hooks: RunHooks) -> RunReport:
        progress = hooks.progress
        assert progress is not None

        def watch(stage: str, fraction: float) -> None:
            if stage == "recovery" and "recovery" not in stages:
                # The client cancels while the job is fine-tuning, as a user would.
                assert client.post(f"/v1/jobs/{job_id}/cancel", headers=auth).status_code == 202
            stages.append(stage)
            progress(stage, fraction)

        return run_pruning(request, dataclasses.replace(hooks, progress=watch))

    assert execute_job(job_id=job_id, context=context, pipeline=cancelling_run) is Outcome.cancelled
    job = _job(client, auth, job_id)
    assert job["status"] == "cancelled" and job["error"]["code"] == "cancelled" and job["cancel_requested"]
    after = stages[stages.index("recovery"):]
    assert set(after) == {"recovery"} and "artifacts" not in stages  # it stopped during recovery
    assert client.get(f"/v1/jobs/{job_id}/artifacts", headers=auth).json()["data"] == []


def test_input_errors_fail_the_job_with_a_specific_code(
    client: TestClient, auth: dict[str, str], context: WorkerContext, model_uri: str, local_root: Path,
) -> None:
    bad = local_root / "no-label"
    write_split(bad / "train.csv", 20, seed=1)
    write_split(bad / "test.csv", 10, seed=2)
    job_id = _submit(client, auth, job_body(model_uri, f"file://{bad}"))
    # Submit refuses such a dataset (tests/api/test_preflight.py); files can change before the job runs.
    for path in (bad / "train.csv", bad / "test.csv"):
        path.write_text(path.read_text().replace("text,label", "text,category"))
    assert execute_job(job_id=job_id, context=context) is Outcome.failed
    job = _job(client, auth, job_id)
    assert job["status"] == "failed" and job["error"]["code"] == "invalid_dataset"
    assert "label" in job["error"]["message"]
    assert "invalid_dataset" in _logs(client, auth, job_id)



def test_a_directory_that_is_not_a_model_fails_as_model_not_loadable(
    client: TestClient, auth: dict[str, str], context: WorkerContext, model_uri: str, dataset_uri: str,
    local_root: Path,
) -> None:
    not_a_model = local_root / "not-a-model"
    shutil.copytree(Path(model_uri.removeprefix("file://")), not_a_model)
    job_id = _submit(client, auth, job_body(f"file://{not_a_model}", dataset_uri))
    # Submit refuses a directory without a model (tests/api/test_preflight.py); it can change before the job runs.
    shutil.rmtree(not_a_model)
    not_a_model.mkdir()
    (not_a_model / "README.md").write_text("weights will follow")
    assert execute_job(job_id=job_id, context=context) is Outcome.failed
    assert _job(client, auth, job_id)["error"]["code"] == "model_not_loadable"


def test_a_file_reference_moved_out_of_the_allowed_roots_after_submit_fails(
    client: TestClient, auth: dict[str, str], context: WorkerContext, model_uri: str, dataset_uri: str,
    local_root: Path, tmp_path: Path,
) -> None:
    data = Path(dataset_uri[len("file://"):])
    (local_root / "link").symlink_to(data)
    job_id = _submit(client, auth, job_body(model_uri, f"file://{local_root}/link"))
    (local_root / "link").unlink()
    outside = tmp_path / "outside"
    data.rename(outside)
    (local_root / "link").symlink_to(outside)  # now points outside the allowed root
    assert execute_job(job_id=job_id, context=context) is Outcome.failed
    job = _job(client, auth, job_id)
    assert job["error"]["code"] == "invalid_reference"
    assert "not in a directory this server may read" in job["error"]["message"]


def test_the_time_limit_stops_a_job(
    client: TestClient, auth: dict[str, str], context: WorkerContext, model_uri: str, dataset_uri: str,
) -> None:
    job_id = _submit(client, auth, job_body(model_uri, dataset_uri))
    limited = WorkerContext(settings=context.settings.model_copy(update={"job_time_limit_s": 1}),
                            sessions=context.sessions, store=context.store, worker_id=context.worker_id)

    def slow_start(request: RunRequest, hooks: RunHooks) -> RunReport:
        progress = hooks.progress
        assert progress is not None

        def late(stage: str, fraction: float) -> None:
            if stage == "load" and fraction == 0.0:
                time.sleep(1.2)  # the model takes "long" to load
            progress(stage, fraction)

        return run_pruning(request, dataclasses.replace(hooks, progress=late))

    assert execute_job(job_id=job_id, context=limited, pipeline=slow_start) is Outcome.failed
    job = _job(client, auth, job_id)
    assert job["error"]["code"] == "time_limit" and "CAHP_JOB_TIME_LIMIT_S" in job["error"]["message"]


def test_a_worker_that_lost_its_job_stops_and_records_nothing(
    client: TestClient, auth: dict[str, str], context: WorkerContext, model_uri: str, dataset_uri: str,
    sessions: sessionmaker[Session],
) -> None:
    job_id = _submit(client, auth, job_body(model_uri, dataset_uri))

    def taken_over(request: RunRequest, hooks: RunHooks) -> RunReport:
        progress = hooks.progress
        assert progress is not None

        def steal(stage: str, fraction: float) -> None:
            if stage == "signatures":
                with transaction(sessions) as session:  # another worker took the job over
                    session.execute(update(Job).where(Job.id == job_id).values(worker_id="other-worker"))
            progress(stage, fraction)

        return run_pruning(request, dataclasses.replace(hooks, progress=steal))

    assert execute_job(job_id=job_id, context=context, pipeline=taken_over) is Outcome.skipped
    with sessions() as session:
        row = session.execute(text("SELECT status, worker_id FROM jobs WHERE id = :id"), {"id": job_id}).one()
        assert tuple(row) == ("running", "other-worker")
        assert repository.list_artifacts(session, job_id=job_id) == []


def test_an_unexpected_error_fails_the_job_with_an_error_id_and_no_traceback_for_the_caller(
    client: TestClient, auth: dict[str, str], context: WorkerContext, model_uri: str, dataset_uri: str,
) -> None:
    job_id = _submit(client, auth, job_body(model_uri, dataset_uri))

    def broken(request: RunRequest, hooks: RunHooks) -> RunReport:
        raise RuntimeError("disk on fire")

    assert execute_job(job_id=job_id, context=context, pipeline=broken) is Outcome.failed
    job = _job(client, auth, job_id)
    assert job["error"]["code"] == "internal_error" and "RuntimeError" in job["error"]["message"]
    assert "error id" in job["error"]["message"] and "disk on fire" not in job["error"]["message"]
    assert "Traceback" not in _logs(client, auth, job_id)


@pytest.mark.parametrize("device", ["cpu"])
def test_the_device_comes_from_the_worker_settings(
    client: TestClient, auth: dict[str, str], context: WorkerContext, model_uri: str, dataset_uri: str, device: str,
) -> None:
    job_id = _submit(client, auth, job_body(model_uri, dataset_uri))
    seen: list[str] = []

    def record(request: RunRequest, hooks: RunHooks) -> RunReport:
        seen.append(request.config.device)
        return run_pruning(request, hooks)

    ctx = WorkerContext(settings=context.settings.model_copy(update={"device": device}), sessions=context.sessions,
                        store=context.store, worker_id="w")
    assert execute_job(job_id=job_id, context=ctx, pipeline=record) is Outcome.succeeded
    assert seen == [device]
    assert f"device {device}" in _logs(client, auth, job_id)


def test_a_missed_accuracy_budget_fails_the_job_and_keeps_the_candidates_report(
    client: TestClient, auth: dict[str, str], context: WorkerContext, local_root: Path,
) -> None:
    dataset_uri = f"file://{write_tiny_dataset(local_root / 'data150', train=150, test=30)}"
    # A dense model whose heads cancel each other's offsets, trained on the same rows: every pruned
    # copy answers one class after fine-tuning alone, so no candidate is within 0 points.
    model_uri = f"file://{write_fragile_model(local_root / 'fragile', train_rows=150, train_seed=1)}"
    job_id = _submit(client, auth, job_body(model_uri, dataset_uri, dense_finetune="never", untrained_dense="warn",
                                            epochs=1, recovery="finetune",
                                            max_accuracy_drop=0.0, budget_metric="macro_f1", stability_shards=0))
    assert execute_job(job_id=job_id, context=context) is Outcome.failed
    job = _job(client, auth, job_id)
    assert job["status"] == "failed" and job["error"]["code"] == "accuracy_budget_not_met"
    assert "within 0 points" in job["error"]["message"] and job["result"] is None
    manifest = {a["name"]: a for a in client.get(f"/v1/jobs/{job_id}/artifacts", headers=auth).json()["data"]}
    assert set(manifest) == {"report.json", "mss_curve.json", "mss_curve.png", "head_map.json", "head_map.png",
                             "layer_retention.png", "budget.png"}
    report = client.get(manifest["report.json"]["url"], headers=auth).json()
    assert report["status"] == "failed" and report["budget"]["chosen"] is None
    assert report["budget"]["carved"] and report["budget"]["validation_rows"] == 15
    assert report["budget"]["dense_validation"] > 0.5  # the dense model learned the task
    assert report["dataset"]["ref"] == dataset_uri  # the job's URI, never a worker path
    logs = _logs(client, auth, job_id)
    assert "stored budget.png, head_map.json" in logs and "report.json" in logs


def test_an_onnx_graph_that_does_not_reproduce_the_model_fails_the_job_with_its_code(
    client: TestClient, auth: dict[str, str], context: WorkerContext, model_uri: str, dataset_uri: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import onnx
    from onnx import numpy_helper

    from cahp_engine.export import _onnx as export_module

    real_export = export_module._export_graph

    def export_then_perturb(wrapper: Any, example: Any, names: Any, path: Path) -> None:
        real_export(wrapper, example, names, path)  # then a classifier weight moves: the graph is wrong
        graph = onnx.load(str(path))
        weight = next(i for i in graph.graph.initializer if "classifier" in i.name and len(i.dims) == 2)
        weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) + 0.05, weight.name))
        onnx.save(graph, str(path))

    monkeypatch.setattr(export_module, "_export_graph", export_then_perturb)
    job_id = _submit(client, auth, job_body(model_uri, dataset_uri, stability_shards=0, export="onnx"))
    assert execute_job(job_id=job_id, context=context) is Outcome.failed
    job = _job(client, auth, job_id)
    assert job["status"] == "failed" and job["error"]["code"] == "export_parity_failed"
    assert "does not reproduce the PyTorch model" in job["error"]["message"] and job["result"] is None
    assert client.get(f"/v1/jobs/{job_id}/artifacts", headers=auth).json()["data"] == []
