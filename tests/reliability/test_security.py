"""The security rules: no code or pickle from a model runs, keys are hashed and compared in constant
time, one key cannot reach another's jobs or uploads, uploads get generated names, and outbound
URLs cannot lead to loopback, link-local or metadata addresses unless allowed.
"""

from __future__ import annotations

import hmac
import json
import os
import pickle
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from app.api.main import create_app
from app.core.db import JobStatus, make_session_factory, repository, transaction
from app.core.db.repository import ArtifactRecord
from app.core.errors import OutboundUrlRefusedError
from app.core.security import authenticate, check_outbound_url
from app.core.settings import Settings
from app.core.storage import open_store
from cahp_engine.models import load_classifier
from tests.support import jobs
from tests.support.helpers import job_body, new_key, service_settings, write_tiny_dataset, write_tiny_model
from tests.support.processes import child_env
from worker.runner import Outcome, WorkerContext, execute_job

SOURCE_ROOTS = ("cahp_engine", "app", "worker")


@pytest.fixture
def api_key(alice: str) -> str:
    """The client is alice's."""
    return alice


@pytest.fixture
def local(settings: Settings) -> Path:
    return settings.allowed_local_roots[0]


def _run(client: TestClient, settings: Settings, engine: Engine, model_uri: str, dataset_uri: str,
         *, refused_at_submit: bool = True) -> dict[str, Any]:
    """The worker's failure of the job; with ``refused_at_submit``, submit refuses it first (the preflight)
    and the worker, given the job all the same (recorded as before the preflight), refuses it alike."""
    body = job_body(model_uri, dataset_uri)
    if not refused_at_submit:
        return _failed(client, settings, engine, client.post("/v1/jobs", json=body).json()["id"])
    refused = client.post("/v1/jobs", json=body)
    assert refused.status_code == 422, refused.text
    result = _failed(client, settings, engine, jobs.record(engine, body, key_name="alice"))
    assert (result["error"]["code"], result["error"]["message"]) == (refused.json()["code"],
                                                                     refused.json()["detail"])
    return result


def _failed(client: TestClient, settings: Settings, engine: Engine, job_id: str) -> dict[str, Any]:
    context = WorkerContext(settings=settings, sessions=make_session_factory(engine), store=open_store(settings),
                            worker_id="security-worker")
    assert execute_job(job_id=job_id, context=context) is Outcome.failed
    result: dict[str, Any] = client.get(f"/v1/jobs/{job_id}").json()
    return result


# --- model loading runs no code from the model -----------------------------------------------------------


class _Trap:
    """Unpickling this creates the directory ``path``: the proof that a pickle was loaded."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[Any, ...]:
        return os.mkdir, (self.path,)


def test_a_model_with_only_pickled_weights_is_refused_without_unpickling(
    client: TestClient, settings: Settings, engine: Engine, local: Path, tmp_path: Path
) -> None:
    # The trap is real: loading this pickle creates the marker file.
    proof = tmp_path / "proof"
    pickle.loads(pickle.dumps(_Trap(proof)))
    assert proof.exists()

    model = write_tiny_model(local / "pickled")
    (model / "model.safetensors").unlink()
    marker = tmp_path / "unpickled"
    torch.save({"bert.embeddings.word_embeddings.weight": _Trap(marker)}, model / "pytorch_model.bin")
    job = _run(client, settings, engine, f"file://{model}", f"file://{write_tiny_dataset(local / 'data')}")
    assert job["error"]["code"] == "model_not_loadable" and "safetensors" in job["error"]["message"]
    assert not marker.exists()


def test_a_model_that_names_custom_code_is_refused_and_the_code_never_runs(
    client: TestClient, settings: Settings, engine: Engine, local: Path, tmp_path: Path
) -> None:
    model = write_tiny_model(local / "custom")
    marker = tmp_path / "custom-code-ran"
    (model / "evil_code.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n"
        "from transformers import BertConfig, BertForSequenceClassification\n"
        "class EvilConfig(BertConfig):\n    pass\n"
        "class EvilModel(BertForSequenceClassification):\n    pass\n"
    )
    config = json.loads((model / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "evil_code.EvilConfig",
                          "AutoModelForSequenceClassification": "evil_code.EvilModel"}
    (model / "config.json").write_text(json.dumps(config))
    job = _run(client, settings, engine, f"file://{model}", f"file://{write_tiny_dataset(local / 'data')}")
    assert job["error"]["code"] == "unsupported_model"
    assert "evil_code" in job["error"]["message"] and "never runs code" in job["error"]["message"]
    # Below the service's refusal, the engine itself loads with trust_remote_code=False: the code is ignored.
    loaded = load_classifier(str(model))
    assert type(loaded.model).__name__ == "BertForSequenceClassification"
    assert not marker.exists()


def test_no_loading_path_in_the_source_allows_remote_code_or_pickles() -> None:
    root = Path(__file__).parents[2]
    offenders = []
    for package in SOURCE_ROOTS:
        for path in (root / package).rglob("*.py"):
            source = path.read_text()
            if re.search(r"trust_remote_code\s*=\s*(True|[a-z_]+\b(?<!False))", source):
                offenders.append(f"{path}: trust_remote_code not literally False")
            for call in re.finditer(r"torch\.load\(([^)]*)\)", source):
                if "weights_only=True" not in call.group(1):
                    offenders.append(f"{path}: torch.load without weights_only=True")
            if re.search(r"\bpickle\.loads?\(|\bjoblib\.load\(|\bdill\.", source):
                offenders.append(f"{path}: unpickles")
    assert offenders == []


# --- API keys -------------------------------------------------------------------------------------------


def test_keys_are_stored_hashed_and_every_check_compares_in_constant_time(
    engine: Engine, alice: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with engine.connect() as connection:
        stored = connection.execute(text("SELECT key_hash FROM api_keys")).scalars().all()
    assert all(alice not in value and re.fullmatch(r"[0-9a-f]{64}", value) for value in stored)

    compared: list[tuple[str, str]] = []
    real = hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    key_id = alice.split("_")[1]
    presented = [alice, alice[:-1] + ("A" if alice[-1] != "A" else "B"), f"cahp_{'z' * 12}_{alice.split('_', 2)[2]}",
                 f"cahp_{key_id}_{'x' * 43}"]
    with make_session_factory(engine)() as session:
        assert authenticate(session=session, key=alice).id == key_id
        for wrong in presented[1:]:
            with pytest.raises(Exception, match="not valid"):
                authenticate(session=session, key=wrong)
    # One constant-time comparison per presented key, unknown key ids included.
    assert len(compared) == len(presented)
    assert all(len(a) == len(b) == 64 for a, b in compared)


# --- one key cannot reach another's resources --------------------------------------------------------


def test_a_key_cannot_see_cancel_download_or_read_logs_of_another_keys_job(
    client: TestClient, engine: Engine, settings: Settings, local: Path
) -> None:
    dataset = f"file://{write_tiny_dataset(local / 'data')}"
    running = client.post("/v1/jobs", json=job_body("hf://org/model", dataset), headers={"Idempotency-Key": "k1"})
    done = client.post("/v1/jobs", json=job_body("hf://org/other", dataset)).json()
    upload = client.post("/v1/uploads", files={"file": ("train.csv", b"text,label\ngood,1\nbad,0\n")}).json()
    sessions = make_session_factory(engine)
    store = open_store(settings)
    (local / "report.json").write_text('{"secret": true}')
    store.put_file(f"jobs/{done['id']}/1/report.json", local / "report.json", media_type="application/json")
    with transaction(sessions) as session:
        repository.claim_job(session, job_id=running.json()["id"], worker_id="w1")
        repository.claim_job(session, job_id=done["id"], worker_id="w2")
        repository.finish_job(session, job_id=done["id"], worker_id="w2", status=JobStatus.succeeded,
                              messages=["a line only alice may read"],
                              artifacts=[ArtifactRecord(name="report.json", size=16, sha256="0" * 64,
                                                        media_type="application/json",
                                                        storage_key=f"jobs/{done['id']}/1/report.json")])
    mallory = {"Authorization": f"Bearer {new_key(engine, 'mallory')}"}
    for job_id in (running.json()["id"], done["id"]):
        for method, path in [("GET", ""), ("POST", "/cancel"), ("GET", "/logs"), ("GET", "/artifacts"),
                             ("GET", "/artifacts/report.json")]:
            response = client.request(method, f"/v1/jobs/{job_id}{path}", headers=mallory)
            assert response.status_code == 404 and response.json()["code"] == "not_found", (method, path)
            assert b"secret" not in response.content and b"alice" not in response.content
    assert client.get("/v1/jobs", headers=mallory).json()["data"] == []
    assert client.get("/v1/jobs?status=succeeded", headers=mallory).json()["data"] == []
    # Another key's upload cannot be used, and the same Idempotency-Key is another key's own.
    body = job_body("hf://org/model", upload["uri"])
    body["dataset"]["eval_uri"] = upload["uri"]
    refused = client.post("/v1/jobs", json=body, headers=mallory)
    assert refused.status_code == 422 and "not an upload of this API key" in refused.json()["detail"]
    own = client.post("/v1/jobs", json=job_body("hf://org/model", dataset),
                      headers={**mallory, "Idempotency-Key": "k1"})
    assert own.status_code == 202 and own.json()["id"] != running.json()["id"]
    # Alice's jobs are untouched.
    assert client.get(f"/v1/jobs/{running.json()['id']}").json()["cancel_requested"] is False
    assert client.get(f"/v1/jobs/{done['id']}/artifacts/report.json").content == b'{"secret": true}'


def test_uploads_are_stored_under_generated_names_whatever_the_client_calls_them(
    client: TestClient, settings: Settings, engine: Engine
) -> None:
    tag = uuid.uuid4().hex[:8]
    hostile = [f"../../../../tmp/{tag}-a.csv", f"..\\..\\{tag}-b.csv", f"/etc/{tag}-c.csv",
               f"C:\\Windows\\{tag}-d.csv", f"%2e%2e%2f{tag}-e.csv", f"ok/../../{tag}-f.csv"]
    for number, name in enumerate(hostile):
        # Bytes of their own: the same bytes again would be the same upload (content-addressed per key).
        data = f"text,label\ngood,1\nbad {number},0\n".encode()
        response = client.post("/v1/uploads", files={"file": (name, data)})
        assert response.status_code == 201, (name, response.text)
        assert "/" not in response.json()["filename"] and "\\" not in response.json()["filename"]
    with engine.connect() as connection:
        keys = connection.execute(text("SELECT storage_key FROM uploads")).scalars().all()
    assert len(keys) == len(hostile) and all(re.fullmatch(r"uploads/[0-9a-f]{32}\.csv", k) for k in keys)
    stored = settings.data_dir / "artifacts" / "uploads"
    assert sorted(p.name for p in stored.iterdir()) == sorted(k.split("/")[1] for k in keys)
    assert not any(tag in str(p) for p in Path("/tmp").glob(f"{tag}*"))
    assert not any(tag in str(p) for p in settings.data_dir.rglob(f"*{tag}*"))


# --- outbound URLs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:9000", "http://localhost:9000", "http://[::1]:9000", "http://169.254.169.254/latest/meta-data",
    "http://[fe80::1]/", "http://0x7f000001/", "http://2130706433/", "http://[::ffff:127.0.0.1]/",
    "http://[::ffff:169.254.169.254]/", "http://0.0.0.0:9000", "http://metadata.google.internal/",
    "http://100.100.100.200/", "http://[fd00:ec2::254]/",
])
def test_outbound_urls_to_loopback_link_local_and_metadata_addresses_are_refused(url: str) -> None:
    with pytest.raises(OutboundUrlRefusedError, match="CAHP_ALLOWED_OUTBOUND_HOSTS"):
        check_outbound_url(url, allowed_hosts=(), what="CAHP_S3_ENDPOINT_URL")


@pytest.mark.parametrize(("url", "allowed"), [
    ("http://10.0.0.5:9000", ()),                           # a private network is where MinIO lives
    ("https://s3.eu-west-1.amazonaws.com", ()),
    ("http://127.0.0.1:9000", ("127.0.0.1",)),
    ("http://localhost:9000", ("localhost",)),
    ("http://127.0.0.1:9000", ("127.0.0.0/8",)),
])
def test_other_hosts_and_explicitly_allowed_ones_pass(url: str, allowed: tuple[str, ...]) -> None:
    check_outbound_url(url, allowed_hosts=allowed, what="CAHP_S3_ENDPOINT_URL")


def test_an_s3_endpoint_at_the_metadata_address_stops_the_service_from_starting(tmp_path: Path) -> None:
    settings = service_settings(tmp_path, artifact_store="s3://bucket/prefix",
                                s3_endpoint_url="http://169.254.169.254/", s3_region="us-east-1")
    with pytest.raises(OutboundUrlRefusedError, match="link-local"):
        create_app(settings)
    allowed = settings.model_copy(update={"allowed_outbound_hosts": ("169.254.169.254",)})
    assert create_app(allowed).state.store is not None


def test_a_hub_endpoint_at_the_metadata_address_fails_hub_jobs(
    client: TestClient, settings: Settings, engine: Engine, local: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", "http://169.254.169.254")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    job = _run(client, settings, engine, "hf://org/model", f"file://{write_tiny_dataset(local / 'data')}",
               refused_at_submit=False)  # a hub model is the worker's to fetch
    assert job["error"]["code"] == "outbound_url_refused" and "HF_ENDPOINT" in job["error"]["message"]


def test_cahp_serve_and_cahp_worker_refuse_to_start_with_an_s3_endpoint_at_the_metadata_address(
    tmp_path: Path,
) -> None:
    env = child_env(data_dir=str(tmp_path / "cahp-data"), artifact_store="s3://bucket/prefix",
                    s3_endpoint_url="http://169.254.169.254/", s3_region="us-east-1")
    for command in (["serve", "--port", "1"], ["worker", "--pool", "solo"]):
        refused = subprocess.run([sys.executable, "-m", "app.cli", *command], env=env, capture_output=True,
                                 text=True, timeout=120)
        assert refused.returncode == 2, (command, refused.stderr[-2000:])
        assert "CAHP_S3_ENDPOINT_URL" in refused.stderr and "CAHP_ALLOWED_OUTBOUND_HOSTS" in refused.stderr
