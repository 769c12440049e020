"""Registration in a real MLflow model registry: a tracking server (SQLite, local artifacts) started here.

A job that asks for ``register`` is registered by the worker of a real ``cahp serve``; ``cahp register``
adds a version of another name; a registry that cannot be reached fails the job as
``registration_failed`` with its artifacts kept, and registering it later works.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from mlflow import MlflowClient

from app.api.main import create_app
from app.cli import main
from tests.support.helpers import (
    free_port,
    job_body,
    migrated_engine,
    new_key,
    service_settings,
    write_tiny_dataset,
    write_tiny_model,
)
from tests.support.mlflow_server import mlflow_server
from tests.support.processes import serving
from worker.runner import Outcome, WorkerContext, execute_job


@pytest.fixture(scope="module")
def tracking_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with mlflow_server(tmp_path_factory.mktemp("mlflow")) as url:
        yield url


def test_a_job_with_register_lands_in_the_registry_and_cahp_register_adds_a_version(
    tmp_path: Path, tracking_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    inputs = tmp_path / "inputs"
    model, data = write_tiny_model(inputs / "reviews-bert"), write_tiny_dataset(inputs / "data")
    with serving(tmp_path, allowed_local_roots=str(inputs), allowed_outbound_hosts="127.0.0.1",
                 mlflow_tracking_uri=tracking_uri, mlflow_experiment="ci-pruning", progress_interval_s="0.2") as served:
        url, log, common = served.url, served.log, served.cli
        assert main(["submit", "--model", f"file://{model}", "--dataset", f"file://{data}", "--param", "epochs=1",
                     "--param", 'dense_finetune="never"', "--param", 'untrained_dense="warn"',
                     "--param", "max_length=32", "--param", "latency_repeats=2",
                     "--label", "git/commit=4f2c9e1", "--name", "reviews-pruned", "--register", "reviews-classifier",
                     *common]) == 0
        job_id = capsys.readouterr().out.strip()
        assert main(["wait", job_id, "--timeout", "300", "--quiet", *common]) == 0, log.read_text()[-3000:]
        # `cahp wait` repeats the job's quality warnings on stderr (this model's head was never trained).
        assert f"cahp: warning: job {job_id} [" in capsys.readouterr().err

        job = httpx.get(f"{url}/v1/jobs/{job_id}", headers=served.auth).json()
        registration = job["registration"]
        assert registration["status"] == "registered" and registration["model_name"] == "reviews-classifier"
        assert registration["version"] == "1" and registration["model_uri"] == "models:/reviews-classifier/1"
        assert job["register"] == {"model_name": "reviews-classifier", "tags": {}, "description": None}

        registry = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
        version = registry.get_model_version("reviews-classifier", "1")
        assert version.run_id == registration["run_id"]
        assert version.tags["cahp.job_id"] == job_id and version.tags["cahp.base_model"] == "reviews-bert"
        assert version.tags["label.git/commit"] == "4f2c9e1" and version.tags["cahp.dataset"] == "data"
        assert "reviews-bert pruned by CAHP" in version.description
        run = registry.get_run(registration["run_id"])
        assert run.info.run_name == "reviews-pruned" and run.info.status == "FINISHED"
        assert registry.get_experiment(run.info.experiment_id).name == "ci-pruning"
        assert run.data.params["config.epochs"] == "1.0" and run.data.params["dataset.eval_split"] == "test"
        assert run.data.metrics["heads_total"] == 8.0 and 0.0 <= run.data.metrics["pruned_accuracy"] <= 1.0
        curve = registry.get_metric_history(run.info.run_id, "mss_curve")
        assert len(curve) >= 2 and all(point.step >= 2 for point in curve)
        logged = {a.path for a in registry.list_artifacts(run.info.run_id)}
        assert {"report.json", "mss_curve.json", "mss_curve.png", "head_map.json", "head_map.png", "model"} <= logged
        files = {a.path for a in registry.list_artifacts(run.info.run_id, "model")}
        assert {"model/MLmodel", "model/model.onnx", "model/checkpoint", "model/tokenizer.json"} <= files

        # What a deployer does: open the registered version as an MLflow ONNX model, and run it.
        import mlflow
        import mlflow.onnx
        import numpy as np
        import onnxruntime as ort

        mlflow.set_tracking_uri(tracking_uri)
        graph = mlflow.onnx.load_model("models:/reviews-classifier/1")
        session = ort.InferenceSession(graph.SerializeToString())
        ids = np.array([[2, 10, 11, 3]], dtype=np.int64)
        feed = {i.name: (ids if i.name == "input_ids" else np.ones_like(ids) if i.name == "attention_mask"
                         else np.zeros_like(ids)) for i in session.get_inputs()}
        assert session.run(["logits"], feed)[0].shape == (1, 3)

        # `cahp register` adds a version to another name, with its own tags.
        assert main(["register", job_id, "--model-name", "reviews-staging", "--tag", "team=nlp", *common]) == 0
        assert capsys.readouterr().out.strip() == "models:/reviews-staging/1"
        staged = registry.get_model_version("reviews-staging", "1")
        assert staged.tags["team"] == "nlp" and staged.tags["cahp.job_id"] == job_id
        # Without a name, the job's own `register` again: a second version of it.
        assert main(["register", job_id, "--json", *common]) == 0
        assert json.loads(capsys.readouterr().out)["version"] == "2"
        # The job keeps every registration, its own first; `registration` is the latest.
        job = httpx.get(f"{url}/v1/jobs/{job_id}", headers=served.auth).json()
        assert [(r["model_name"], r["version"]) for r in job["registrations"]] == [
            ("reviews-classifier", "1"), ("reviews-staging", "1"), ("reviews-classifier", "2")]
        assert job["registration"] == job["registrations"][-1]


def test_an_unreachable_registry_fails_the_job_keeps_its_model_and_a_later_register_works(
    tmp_path: Path, tracking_uri: str, local_root: Path,
) -> None:
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens here
    down = service_settings(tmp_path, allowed_outbound_hosts=("127.0.0.1",), mlflow_tracking_uri=closed)
    up = down.model_copy(update={"mlflow_tracking_uri": tracking_uri})
    engine = migrated_engine(down)
    auth = {"Authorization": f"Bearer {new_key(engine)}"}
    model = f"file://{write_tiny_model(local_root / 'model')}"
    data = f"file://{write_tiny_dataset(local_root / 'data')}"
    from app.core.db import make_session_factory
    from app.core.storage import open_store

    context = WorkerContext(settings=down, sessions=make_session_factory(engine), store=open_store(down),
                            worker_id="w")
    with TestClient(create_app(down)) as client:
        body = {**job_body(model, data), "register": {"model_name": "retried", "tags": {"stage": "ci"}}}
        job_id = client.post("/v1/jobs", json=body, headers=auth).json()["id"]
        assert execute_job(job_id=job_id, context=context) is Outcome.failed
        job = client.get(f"/v1/jobs/{job_id}", headers=auth).json()
        assert job["error"]["code"] == "registration_failed" and closed in job["error"]["message"]
        assert job["registration"]["status"] == "failed" and job["result"]["heads_total"] == 8
        names = {a["name"] for a in client.get(f"/v1/jobs/{job_id}/artifacts", headers=auth).json()["data"]}
        assert {"model.tar.gz", "report.json"} <= names  # the model is kept, to be registered later
        # The API process of a server whose registry is down answers 502 with MLflow's failure.
        refused = client.post(f"/v1/jobs/{job_id}/register", headers=auth)
        assert refused.status_code == 502 and refused.json()["code"] == "registration_failed"
    with TestClient(create_app(up)) as client:
        registered = client.post(f"/v1/jobs/{job_id}/register", headers=auth)
        assert registered.status_code == 200, registered.text
        assert registered.json()["model_uri"] == "models:/retried/1"
        assert client.get(f"/v1/jobs/{job_id}", headers=auth).json()["registration"]["status"] == "registered"
    version = MlflowClient(tracking_uri=tracking_uri).get_model_version("retried", "1")
    assert version.tags["stage"] == "ci" and version.tags["cahp.job_id"] == job_id
    engine.dispose()
