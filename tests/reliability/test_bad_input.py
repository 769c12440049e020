"""The bad-input matrix: every hostile or broken input gets an answer that says what to change.

What the API can judge at submit time is a 4xx ``application/problem+json`` with a specific
``code`` and a ``detail`` naming the problem; that includes what the worker would find in a model or
dataset the API can read (the preflight runs the worker's checks). What only the worker can find (a
hub model that does not exist) ends the job ``failed`` with a specific code, through the worker's
own code path; the worker returns normally (it would raise if it crashed), the job is not
left running, and nothing is stored.
"""

from __future__ import annotations

import csv
import io
import json
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import transformers
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from app.core.db import Job, make_session_factory
from app.core.settings import Settings
from app.core.storage import open_store
from tests.support.helpers import (
    job_body,
    write_split,
    write_tiny_dataset,
    write_tiny_model,
)
from tests.support.tiny_models import make_tokenizer
from worker.runner import Outcome, WorkerContext, execute_job


@pytest.fixture
def api_key(key: str) -> str:
    """The client sends a valid key."""
    return key


@pytest.fixture
def local(settings: Settings) -> Path:
    return settings.allowed_local_roots[0]


@pytest.fixture
def model_uri(local: Path) -> str:
    return f"file://{write_tiny_model(local / 'model')}"


@pytest.fixture
def dataset_uri(local: Path) -> str:
    return f"file://{write_tiny_dataset(local / 'data')}"


def _problem(response: Any, status: int, code: str, *fragments: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert body["status"] == status and body["code"] == code, body
    for fragment in fragments:
        assert fragment in body["detail"], (fragment, body["detail"])


# --- refused at submit -------------------------------------------------------------------------------


def _tar(*members: tuple[str, str, bytes | str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for kind, name, payload in members:
            info = tarfile.TarInfo(name)
            if kind == "sym":
                info.type, info.linkname = tarfile.SYMTYPE, str(payload)
                tar.addfile(info)
            else:
                data = payload if isinstance(payload, bytes) else payload.encode()
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _zip(name: str) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr(name, "text,label\nfine,1\n")
    return buffer.getvalue()


SUBMIT_CASES: dict[str, tuple[Callable[[TestClient, str, str], Any], int, str, tuple[str, ...]]] = {
    "malformed JSON": (
        lambda c, m, d: c.post("/v1/jobs", content=b'{"model": {"uri": "hf://a/b"},',
                               headers={"content-type": "application/json"}),
        422, "invalid_request", ("not valid JSON",)),
    "JSON body that is not UTF-8": (
        lambda c, m, d: c.post("/v1/jobs", content='{"model": "voil\u00e0"}'.encode("latin-1"),
                               headers={"content-type": "application/json"}),
        400, "bad_request", ("send UTF-8 JSON",)),
    "unknown top-level field": (
        lambda c, m, d: c.post("/v1/jobs", json={**job_body(m, d), "priority": "high"}),
        422, "invalid_request", ("`body.priority` is not a field", "remove it")),
    "unknown pruning setting": (
        lambda c, m, d: c.post("/v1/jobs", json=job_body(m, d, polydegree=2)),
        422, "invalid_request", ("`body.params.polydegree` is not a field this API knows; did you mean poly_degree?",)),
    "poly_degree 0": (
        lambda c, m, d: c.post("/v1/jobs", json=job_body(m, d, poly_degree=0)),
        422, "invalid_config", ("`poly_degree` must be an integer between 1 and 10, got 0",)),
    "calibration_fraction 1.5": (
        lambda c, m, d: c.post("/v1/jobs", json=job_body(m, d, calibration_fraction=1.5)),
        422, "invalid_config", ("`calibration_fraction` must be a number in (0.0, 1.0], got 1.5",)),
    "negative epochs": (
        lambda c, m, d: c.post("/v1/jobs", json=job_body(m, d, epochs=-1)),
        422, "invalid_config", ("`epochs` must be", "got -1")),
    "upload over the size limit": (
        lambda c, m, d: c.post("/v1/uploads", files={"file": ("train.csv", b"x" * (600 * 1024))}),
        413, "payload_too_large", ("larger than the limit of 524288 bytes",)),
    "empty upload": (
        lambda c, m, d: c.post("/v1/uploads", files={"file": ("train.csv", b"")}),
        422, "invalid_upload", ("is empty",)),
    "tar with ..": (
        lambda c, m, d: c.post("/v1/uploads", files={"file": ("d.tar.gz", _tar(("file", "../evil.csv", "x")))}),
        422, "invalid_upload", ("'..'", "remove it")),
    "tar with an absolute path": (
        lambda c, m, d: c.post("/v1/uploads", files={"file": ("d.tar.gz", _tar(("file", "/etc/cron.d/x", "x")))}),
        422, "invalid_upload", ("absolute path",)),
    "tar with a link out of it": (
        lambda c, m, d: c.post("/v1/uploads", files={"file": ("d.tar.gz", _tar(("sym", "train.csv", "../../x")))}),
        422, "invalid_upload", ("symbolic link", "tar -h")),
    "zip with ..": (
        lambda c, m, d: c.post("/v1/uploads", files={"file": ("d.zip", _zip("../../evil.csv"))}),
        422, "invalid_upload", ("'..'",)),
    "file:// outside the allowed roots": (
        lambda c, m, d: c.post("/v1/jobs", json=job_body(m, "file:///etc")),
        422, "invalid_reference", ("not in a directory this server may read",)),
}


def _no_server_paths(text: str, settings: Settings) -> None:
    """No directory of the server's own (data, work, spool, Python) in what a caller reads."""
    import sys

    for path in (settings.data_dir, settings.resolved_work_dir, settings.spool_dir, sys.prefix):
        assert str(path) not in text, (str(path), text[:2000])
    assert "Traceback" not in text


@pytest.mark.parametrize("case", list(SUBMIT_CASES))
def test_bad_submissions_are_problems_that_say_what_to_change(
    case: str, client: TestClient, model_uri: str, dataset_uri: str, engine: Engine, settings: Settings
) -> None:
    send, status, code, fragments = SUBMIT_CASES[case]
    response = send(client, model_uri, dataset_uri)
    _problem(response, status, code, *fragments)
    _no_server_paths(response.text, settings)
    with make_session_factory(engine)() as session:
        assert session.query(Job).count() == 0  # nothing was recorded


def test_an_artifact_name_with_path_traversal_is_not_found(
    client: TestClient, model_uri: str, dataset_uri: str, settings: Settings
) -> None:
    job = client.post("/v1/jobs", json=job_body(model_uri, dataset_uri)).json()
    secret = settings.data_dir / "cahp.db"
    for name in ("..%2F..%2F..%2Fcahp.db", "%2e%2e%2f%2e%2e%2fcahp.db", "%2E%2E", "..%5C..%5Ccahp.db"):
        response = client.get(f"/v1/jobs/{job['id']}/artifacts/{name}")
        assert response.status_code == 404, (name, response.status_code)
        assert response.headers["content-type"] == "application/problem+json"
        assert secret.read_bytes()[:16] not in response.content


# --- found by the worker -------------------------------------------------------------------------------


def _rows(path: Path, header: list[str], rows: list[list[Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        csv.writer(handle).writerows([header, *rows])


def _missing_label(root: Path) -> str:
    for split in ("train", "test"):
        path = write_split(root / f"{split}.csv", 20, seed=5)
        path.write_text(path.read_text().replace("text,label", "text,category"))
    return f"file://{root}"


def _one_class(root: Path) -> str:
    _rows(root / "train.csv", ["text", "label"], [[f"sample {i}", "positive"] for i in range(20)])
    _rows(root / "test.csv", ["text", "label"], [[f"sample {i}", "positive"] for i in range(10)])
    return f"file://{root}"


def _empty_file(root: Path) -> str:
    write_tiny_dataset(root)
    (root / "train.csv").write_bytes(b"")
    return f"file://{root}"


def _not_utf8(root: Path) -> str:
    write_tiny_dataset(root)
    (root / "train.csv").write_bytes("text,label\nvoil\u00e0 un film,1\n".encode("latin-1") * 10)
    return f"file://{root}"


def _ragged(root: Path) -> str:
    write_tiny_dataset(root)
    with open(root / "train.csv", "a") as handle:
        handle.write("a review, with an unquoted comma,2\n")
    return f"file://{root}"


def _unsafe_archive(root: Path) -> str:
    root.mkdir(parents=True)
    (root / "data.tar.gz").write_bytes(_tar(("file", "../../escaped.csv", "text,label\nx,1\n")))
    return f"file://{root / 'data.tar.gz'}"


def _gpt2(root: Path) -> str:
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=64, num_labels=3,
                                     pad_token_id=0)
    transformers.GPT2ForSequenceClassification(config).save_pretrained(root)
    make_tokenizer().save_pretrained(root)
    return f"file://{root}"


#: case -> (what to submit as (model, dataset), the error code, a fragment of its message)
WORKER_CASES: dict[str, tuple[Callable[[Path, str, str], tuple[str, str]], str, str]] = {
    "unknown hub model": (lambda r, m, d: ("hf://nobody-here/no-such-model", d), "model_not_loadable",
                          "was not found on the Hugging Face hub"),
}
#: What the worker would find but submit finds first (the preflight runs the worker's checks): the same
#: code and words, at once, and no job.
PREFLIGHT_CASES: dict[str, tuple[Callable[[Path, str, str], tuple[str, str]], str, str]] = {
    "not an encoder classifier": (lambda r, m, d: (_gpt2(r), d), "unsupported_model", "gpt2"),
    "dataset without the label column": (lambda r, m, d: (m, _missing_label(r)), "invalid_dataset", "label"),
    "one class only": (lambda r, m, d: (m, _one_class(r)), "invalid_dataset", "one class only"),
    "empty file": (lambda r, m, d: (m, _empty_file(r)), "invalid_dataset", "is empty"),
    "non-UTF-8 text": (lambda r, m, d: (m, _not_utf8(r)), "invalid_dataset", "is not UTF-8"),
    "CSV with ragged rows": (lambda r, m, d: (m, _ragged(r)), "invalid_dataset", "fields where the header has"),
    "archive escaping its directory": (lambda r, m, d: (m, _unsafe_archive(r)), "invalid_upload", "'..'"),
}


@pytest.mark.parametrize("case", list(PREFLIGHT_CASES))
def test_inputs_the_worker_would_refuse_are_refused_at_submit_with_its_code(
    case: str, client: TestClient, settings: Settings, engine: Engine, local: Path, model_uri: str,
    dataset_uri: str,
) -> None:
    build, code, fragment = PREFLIGHT_CASES[case]
    model, dataset = build(local / "case", model_uri, dataset_uri)
    response = client.post("/v1/jobs", json=job_body(model, dataset))
    _problem(response, 422, code, fragment)
    _no_server_paths(response.text, settings)
    with make_session_factory(engine)() as session:
        assert session.query(Job).count() == 0
    assert not (local / "escaped.csv").exists() and not (local.parent / "escaped.csv").exists()


@pytest.mark.parametrize("case", list(WORKER_CASES))
def test_inputs_only_the_worker_can_judge_fail_the_job_with_a_specific_code(
    case: str, client: TestClient, settings: Settings, engine: Engine, local: Path, model_uri: str,
    dataset_uri: str,
) -> None:
    build, code, fragment = WORKER_CASES[case]
    model, dataset = build(local / "case", model_uri, dataset_uri)
    submitted = client.post("/v1/jobs", json=job_body(model, dataset))
    assert submitted.status_code == 202, submitted.text
    job_id = submitted.json()["id"]
    context = WorkerContext(settings=settings, sessions=make_session_factory(engine), store=open_store(settings),
                            worker_id="matrix-worker")
    assert execute_job(job_id=job_id, context=context) is Outcome.failed
    job = client.get(f"/v1/jobs/{job_id}").json()
    assert job["status"] == "failed" and job["finished_at"] is not None, job
    assert job["error"]["code"] == code and fragment in job["error"]["message"], job["error"]
    _no_server_paths(json.dumps(job), settings)
    _no_server_paths(client.get(f"/v1/jobs/{job_id}/logs").text, settings)
    assert client.get(f"/v1/jobs/{job_id}/artifacts").json()["data"] == []
    with make_session_factory(engine)() as session:
        row = session.get(Job, job_id)
        assert row is not None and row.lease_expires_at is None
    assert not (local / "escaped.csv").exists() and not (local.parent / "escaped.csv").exists()
