"""What a finished job hands the platform: a named model, its warnings, and links that need no key."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from huggingface_hub import ModelCard

from app.api.background import dispatch_once
from app.core.settings import Settings
from tests.support.helpers import job_body, service_settings, tar_directory, write_tiny_model
from tests.support.receiver import Receiver
from worker.runner import Outcome, WorkerContext, execute_job


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    # The receiver listens on loopback; links in payloads are absolute under the API's public address.
    return service_settings(tmp_path, allowed_outbound_hosts=("127.0.0.1",), webhook_interval_s=0.0,
                            public_url="http://testserver")


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver().start()
    yield found
    found.stop()


def _upload_model(client: TestClient, auth: dict[str, str], tmp_path: Path) -> str:
    """The tiny model uploaded as ``reviews-bert.tar.gz``, the way `cahp submit --model ./reviews-bert` packs it."""
    model = write_tiny_model(tmp_path / "reviews-bert")
    archive = tar_directory(model, tmp_path / "reviews-bert.tar.gz")
    with archive.open("rb") as handle:
        response = client.post("/v1/uploads", files={"file": ("reviews-bert.tar.gz", handle)}, headers=auth)
    assert response.status_code == 201, response.text
    return str(response.json()["uri"])


def test_a_succeeded_job_names_its_model_warns_and_hands_out_links(
    client: TestClient, auth: dict[str, str], context: WorkerContext, dataset_uri: str, settings: Settings,
    receiver: Receiver, tmp_path: Path,
) -> None:
    assert client.post("/v1/webhooks", json={"url": receiver.url, "events": ["job.succeeded"]},
                       headers=auth).status_code == 201
    model_uri = _upload_model(client, auth, tmp_path)
    body: dict[str, Any] = {**job_body(model_uri, dataset_uri, export="none", dense_finetune="never",
                                      untrained_dense="warn"),
                            "name": "reviews-pruned", "labels": {"git/commit": "4f2c9e1"}}
    submitted = client.post("/v1/jobs", json=body, headers=auth).json()
    # Before any worker read it, the job is named after what was uploaded, not after an upload id.
    assert (submitted["name"], submitted["model_name"], submitted["dataset_name"]) == ("reviews-pruned",
                                                                                       "reviews-bert", "data")
    job_id = submitted["id"]
    assert execute_job(job_id=job_id, context=context) is Outcome.succeeded

    job = client.get(f"/v1/jobs/{job_id}", headers=auth).json()
    assert job["result"]["base_model"] == "reviews-bert" and job["result"]["dataset"] == "data"
    # The untrained head on random text: quality warnings in the job's result, first.
    warnings = job["result"]["warnings"]
    assert any("never predicts" in w or "near chance" in w for w in warnings[:2]), warnings
    listed = client.get("/v1/jobs", headers=auth).json()["data"][0]
    assert listed["name"] == "reviews-pruned" and listed["model_name"] == "reviews-bert"

    # report.json and the card say what the model is and who asked for it.
    manifest = {a["name"]: a for a in client.get(f"/v1/jobs/{job_id}/artifacts", headers=auth).json()["data"]}
    report = client.get(manifest["report.json"]["signed_url"]).json()
    assert report["identity"]["job_id"] == job_id and report["identity"]["name"] == "reviews-pruned"
    assert report["identity"]["labels"] == {"git/commit": "4f2c9e1"}
    assert report["identity"]["base_model"] == "reviews-bert"
    assert report["recipe"]["classifier_head"] == "checkpoint" and report["recipe"]["recovery"]["epochs"] == 1
    packed = client.get(manifest["model.tar.gz"]["signed_url"]).content
    with tarfile.open(fileobj=io.BytesIO(packed)) as tar:
        member = tar.extractfile("model/README.md")
        assert member is not None
        card = ModelCard(member.read().decode())
    assert card.text.startswith("# reviews-pruned\n\n> **Quality warnings**")
    assert card.data.to_dict()["cahp"]["job_id"] == job_id

    # The webhook says the same, with links a receiver downloads without the submitter's key.
    outcomes = [a.outcome for a in dispatch_once(sessions=context.sessions, settings=settings)]
    assert outcomes == ["delivered"]
    data = json.loads(receiver.of_type("job.succeeded")[0].body)["data"]
    assert data["name"] == "reviews-pruned" and data["labels"] == {"git/commit": "4f2c9e1"}
    assert data["model"] == {"uri": model_uri, "revision": None, "name": "reviews-bert"}
    assert data["dataset"] == {"uri": dataset_uri, "name": "data"}
    assert data["params"]["epochs"] == 1 and data["warnings"] == warnings and data["cahp_version"]
    assert data["identity"] == report["identity"] and data["recipe"] == report["recipe"]
    links = {a["name"]: a for a in data["artifacts"]}
    assert set(links) == set(manifest)
    assert links["model.tar.gz"]["signed_url"].startswith(f"http://testserver/v1/artifacts/{job_id}/model.tar.gz?")
    fetched = client.get(links["model.tar.gz"]["signed_url"])  # no Authorization header
    assert fetched.status_code == 200 and fetched.content == packed
