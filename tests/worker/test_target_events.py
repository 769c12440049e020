"""A speed-target job through the real worker: it reads the worker's cached latency table, and its final
event carries the target's record as fields, delivered to a real webhook receiver."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.api.background import dispatch_once
from app.core.settings import Settings
from tests.support.helpers import job_body, service_settings, write_tiny_model
from tests.support.latency import seed_latency_table
from tests.support.receiver import Receiver
from worker.claims import latency_cache_dir
from worker.runner import Outcome, WorkerContext, execute_job

BATCH, SEQ_LEN = 4, 16


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return service_settings(tmp_path, allowed_outbound_hosts=("127.0.0.1",), webhook_interval_s=0.0)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver().start()
    yield found
    found.stop()


def test_a_speed_target_job_reads_the_workers_table_and_its_event_carries_the_target(
    client: TestClient, auth: dict[str, str], context: WorkerContext, settings: Settings, local_root: Path,
    dataset_uri: str, receiver: Receiver,
) -> None:
    model_dir = write_tiny_model(local_root / "model")
    table = seed_latency_table(settings, model_dir, batch_size=BATCH, seq_len=SEQ_LEN)
    assert latency_cache_dir(settings).is_relative_to(settings.data_dir)  # on the data volume, not the container's home
    assert client.post("/v1/webhooks", json={"url": receiver.url, "events": ["job.succeeded"]},
                       headers=auth).status_code == 201
    body = job_body(f"file://{model_dir}", dataset_uri, target_speedup=1.5, target_batch=BATCH,
                    target_seq_len=SEQ_LEN, stability_shards=0, recovery="reconstruct", latency_repeats=1)
    response = client.post("/v1/jobs", json=body, headers=auth)
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]
    assert execute_job(job_id=job_id, context=context) is Outcome.succeeded

    manifest = {a["name"]: a for a in client.get(f"/v1/jobs/{job_id}/artifacts", headers=auth).json()["data"]}
    target = client.get(manifest["report.json"]["url"], headers=auth).json()["target"]
    # The allocation used the table from the worker's cache: its fit error and what it says is reachable.
    assert target["fit_error"] == table.fit_error
    assert target["reachable_speedup"] == pytest.approx(table.dense / table.floor)

    assert [a.outcome for a in dispatch_once(sessions=context.sessions, settings=settings)] == ["delivered"]
    data = json.loads(receiver.of_type("job.succeeded")[0].body)["data"]
    assert data["target"] == target
    assert (data["target"]["kind"], data["target"]["target"], data["target"]["runtime"]) == ("speedup", 1.5, "pytorch")
    assert data["target"]["measured_speedup"] > 0 and 0 < data["target"]["flops_kept"] < 1
    assert len(data["target"]["heads_per_layer"]) == len(data["target"]["neurons_per_layer"]) == table.num_layers
    assert data["result"]["heads_kept"] == sum(data["target"]["heads_per_layer"])
