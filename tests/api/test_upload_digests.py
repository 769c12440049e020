"""Uploads addressed by their content, per key: the same bytes give the same upload, found by their sha256.

Also the "did you mean" of an unknown field, and the submissions counter.
"""

from __future__ import annotations

import hashlib

from fastapi.testclient import TestClient
from sqlalchemy import Engine

from app.core.metrics import REGISTRY
from app.core.settings import Settings
from tests.support.helpers import job_body, new_key, write_tiny_dataset

DATA = b"text,label\ngood film,1\nbad film,0\n"


def test_the_same_bytes_uploaded_again_are_the_same_upload_found_by_their_digest(
    client: TestClient, auth: dict[str, str], settings: Settings,
) -> None:
    first = client.post("/v1/uploads", files={"file": ("train.csv", DATA)}, headers=auth)
    again = client.post("/v1/uploads", files={"file": ("other-name.csv", DATA)}, headers=auth)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["uri"] == first.json()["uri"]
    stored = list((settings.data_dir / "artifacts" / "uploads").iterdir())
    assert len(stored) == 1  # stored once

    digest = hashlib.sha256(DATA).hexdigest()
    found = client.get(f"/v1/uploads/sha256:{digest}", headers=auth)
    assert found.status_code == 200 and found.json() == first.json()
    assert client.head(f"/v1/uploads/sha256:{digest}", headers=auth).status_code == 200
    missing = client.get(f"/v1/uploads/sha256:{'0' * 64}", headers=auth)
    assert missing.status_code == 404 and missing.json()["code"] == "not_found"
    assert client.head(f"/v1/uploads/sha256:{'0' * 64}", headers=auth).status_code == 404
    bad = client.get("/v1/uploads/md5:abc", headers=auth)
    assert bad.status_code == 422 and "sha256:" in bad.json()["detail"]
    # Other bytes under a suffix of another kind are another upload.
    jsonl = client.post("/v1/uploads", files={"file": ("train.jsonl", DATA)}, headers=auth)
    assert jsonl.status_code == 201 and jsonl.json()["uri"] != first.json()["uri"]


def test_a_digest_tells_nothing_of_another_keys_uploads(
    client: TestClient, auth: dict[str, str], engine: Engine,
) -> None:
    mine = client.post("/v1/uploads", files={"file": ("train.csv", DATA)}, headers=auth).json()
    other = {"Authorization": f"Bearer {new_key(engine, 'bob')}"}
    digest = hashlib.sha256(DATA).hexdigest()
    assert client.get(f"/v1/uploads/sha256:{digest}", headers=other).status_code == 404
    theirs = client.post("/v1/uploads", files={"file": ("train.csv", DATA)}, headers=other)
    assert theirs.status_code == 201 and theirs.json()["uri"] != mine["uri"]  # their own upload
    refused = client.post("/v1/jobs", json=job_body("hf://org/model", mine["uri"]), headers=other)
    assert refused.status_code == 422 and refused.json()["code"] == "invalid_reference"


def test_an_unknown_setting_gets_the_nearest_names(client: TestClient, auth: dict[str, str]) -> None:
    response = client.post("/v1/jobs", json=job_body("hf://org/model", "hf://datasets/org/data", epoch=1),
                           headers=auth)
    assert response.status_code == 422
    assert response.json()["detail"].startswith(
        "`body.params.epoch` is not a field this API knows; did you mean epochs?")
    unknown = client.post("/v1/jobs", json={**job_body("hf://org/model", "hf://datasets/org/data"), "labls": {}},
                          headers=auth)
    assert "`body.labls` is not a field this API knows; did you mean labels?" in unknown.json()["detail"]
    webhook = client.post("/v1/webhooks", json={"url": "https://example.com/h", "event": []}, headers=auth)
    assert "`body.event` is not a field this API knows; did you mean events?" in webhook.json()["detail"]


def test_created_jobs_are_counted_and_replays_are_not(
    client: TestClient, auth: dict[str, str], settings: Settings,
) -> None:
    data = write_tiny_dataset(settings.allowed_local_roots[0] / "data")
    before = REGISTRY.get_sample_value("cahp_jobs_submitted_total") or 0.0
    body = job_body("hf://org/model", f"file://{data}")
    for _ in range(2):
        assert client.post("/v1/jobs", json=body, headers={**auth, "Idempotency-Key": "k1"}).status_code in (200, 202)
    assert client.post("/v1/jobs", json=body, headers=auth).status_code == 202
    assert REGISTRY.get_sample_value("cahp_jobs_submitted_total") == before + 2
