"""Schema fuzzing: schemathesis generates requests from the service's own OpenAPI document.

Every operation gets valid-looking requests (positive mode) and requests that break the schema
(negative mode), sent with a valid API key; the job-scoped operations get them once more for a job
that exists and has an artifact, so real answers are checked too. No answer may be a 5xx, use a
status the document does not list, or carry a body or content type the document does not
describe. The run is bounded (a fixed number of examples per operation and mode, derandomized, no
example database), so its CI time is stable.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from app.api.main import create_app
from app.core.db import JobStatus, make_session_factory, repository, transaction
from app.core.db.repository import ArtifactRecord
from app.core.storage import open_store
from tests.support.helpers import job_body, migrated_engine, new_key, service_settings, write_tiny_dataset

EXAMPLES_PER_OPERATION = 25
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@dataclass
class Service:
    app: FastAPI
    auth: dict[str, str]
    job_id: str


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    root = tmp_path_factory.mktemp("fuzz")
    config = service_settings(root)
    data = write_tiny_dataset(config.allowed_local_roots[0] / "data")
    engine = migrated_engine(config)
    auth = {"Authorization": f"Bearer {new_key(engine, 'fuzzer')}"}
    app = create_app(config)
    with TestClient(app, headers=auth) as client:
        job_id = client.post("/v1/jobs", json=job_body("hf://org/model", f"file://{data}")).json()["id"]
    # The job ran and left a report, so artifact downloads answer with real bytes.
    report = root / "report.json"
    report.write_text('{"k_star": 2}')
    open_store(config).put_file(f"jobs/{job_id}/1/report.json", report, media_type="application/json")
    with transaction(make_session_factory(engine)) as session:
        repository.claim_job(session, job_id=job_id, worker_id="w")
        repository.finish_job(session, job_id=job_id, worker_id="w", status=JobStatus.succeeded,
                              result={"k_star": 2}, messages=["done"], artifacts=[ArtifactRecord(
                                  name="report.json", size=13, sha256="0" * 64, media_type="application/json",
                                  storage_key=f"jobs/{job_id}/1/report.json")])
    yield Service(app=app, auth=auth, job_id=job_id)
    engine.dispose()


def _has_inputs(operation: Any) -> bool:
    return any(len(part) for part in (operation.path_parameters, operation.query, operation.headers,
                                      operation.body))


def _fuzz(operation: Any, mode: GenerationMode, auth: dict[str, str], **fixed: Any) -> None:
    @given(case=operation.as_strategy(generation_mode=mode, **fixed))
    @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, derandomize=True, database=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    def exchange(case: schemathesis.Case) -> None:
        response = case.call(headers=auth)
        case.validate_response(response, checks=CHECKS)

    exchange()


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=lambda m: m.value)
def test_no_generated_request_gets_a_server_error_or_an_answer_outside_the_schema(
    service: Service, mode: GenerationMode
) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", service.app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10
    for operation in operations:
        if mode is GenerationMode.NEGATIVE and not _has_inputs(operation):
            continue  # /healthz and /readyz take nothing that could be made invalid
        _fuzz(operation, mode, service.auth)
        if "{job_id}" in operation.path and mode is GenerationMode.POSITIVE:
            fixed: dict[str, str] = {"job_id": service.job_id}
            if "{name}" in operation.path:
                fixed["name"] = "report.json"
            _fuzz(operation, mode, service.auth, path_parameters=fixed)
