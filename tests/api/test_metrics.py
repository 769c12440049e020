"""``GET /metrics``: Prometheus text that the Prometheus parser reads, every metric ``cahp_*``."""

from __future__ import annotations

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine

from app.core.settings import Settings
from tests.support.jobs import finish, start, submit


def scrape(client: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        assert family.name.startswith("cahp_"), family.name
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def test_metrics_parse_and_move_with_requests_and_jobs(
    client: TestClient, auth: dict[str, str], engine: Engine, settings: Settings
) -> None:
    before = scrape(client)
    assert before[("cahp_jobs", (("status", "queued"),))] == 0
    job_id = submit(client, auth, settings)
    assert client.get(f"/v1/jobs/{job_id}", headers=auth).status_code == 200
    assert client.get("/v1/jobs/nope", headers=auth).status_code == 404
    middle = scrape(client)
    assert middle[("cahp_jobs", (("status", "queued"),))] == 1
    polls = ("cahp_http_request_duration_seconds_count",
             (("method", "GET"), ("route", "/v1/jobs/{job_id}"), ("status", "200")))
    assert middle[polls] == before.get(polls, 0) + 1
    missing = (polls[0], (("method", "GET"), ("route", "/v1/jobs/{job_id}"), ("status", "404")))
    assert middle[missing] == before.get(missing, 0) + 1
    assert middle[("cahp_queue_oldest_job_age_seconds", ())] > 0
    start(engine, job_id)
    finish(engine, job_id)
    after = scrape(client)
    assert after[("cahp_jobs", (("status", "queued"),))] == 0
    assert after[("cahp_jobs", (("status", "succeeded"),))] == 1
    assert after[("cahp_queue_oldest_job_age_seconds", ())] == 0
