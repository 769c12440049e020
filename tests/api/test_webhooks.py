"""Webhooks: registration, the outbound guard, and deliveries to a real receiver on loopback.

The dispatcher's ``dispatch_once`` is called directly (its thread is off in these settings), so each
test decides when deliveries go out; the HTTP requests, signatures and the receiver are real.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, update
from standardwebhooks.webhooks import Webhook as Verifier
from standardwebhooks.webhooks import WebhookVerificationError

from app.api.background import backoff_s, dispatch_once
from app.api.background._dispatcher import _retry_after
from app.core.db import JobStatus, WebhookDelivery, make_session_factory, utcnow
from app.core.settings import Settings
from tests.support.helpers import service_settings
from tests.support.jobs import finish, progress, start, submit
from tests.support.receiver import Receiver


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return service_settings(tmp_path, allowed_outbound_hosts=("127.0.0.1",), webhook_interval_s=0.0,
                            webhook_retry_initial_s=0.05, webhook_retry_max_s=0.2)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver().start()
    yield found
    found.stop()


def _dispatch(engine: Engine, settings: Settings) -> list[str]:
    return [a.outcome for a in dispatch_once(sessions=make_session_factory(engine), settings=settings)]


def _retried(engine: Engine, settings: Settings) -> list[int | None]:
    """Send what is due, each a retry, then move the retries' time to now rather than wait for it: the status
    codes the receiver answered with.

    A retry waits the longest an attempt may take plus the back-off, however the attempt failed; the attempts
    keep the real timeout, so a receiver on a busy machine answers within it."""
    sent = dispatch_once(sessions=make_session_factory(engine), settings=settings)
    assert sent and all(a.outcome == "retry" and a.next_attempt_at is not None for a in sent), sent
    assert all((a.next_attempt_at - a.attempted_at).total_seconds() >= settings.webhook_timeout_s for a in sent)
    with engine.begin() as connection:
        connection.execute(update(WebhookDelivery).where(WebhookDelivery.status == "pending")
                           .values(next_attempt_at=utcnow()))
    return [a.status_code for a in sent]


def _register(client: TestClient, auth: dict[str, str], url: str, **extra: object) -> dict:
    response = client.post("/v1/webhooks", json={"url": url, **extra}, headers=auth)
    assert response.status_code == 201, response.text
    return dict(response.json())


def test_an_endpoint_is_registered_listed_without_its_secret_and_deleted(
    client: TestClient, auth: dict[str, str], receiver: Receiver
) -> None:
    created = _register(client, auth, receiver.url, events=["job.succeeded"])
    assert created["secret"].startswith("whsec_") and created["events"] == ["job.succeeded"]
    listed = client.get("/v1/webhooks", headers=auth).json()["data"]
    assert listed == [{k: v for k, v in created.items() if k != "secret"}]
    assert client.delete(f"/v1/webhooks/{created['id']}", headers=auth).status_code == 204
    assert client.get("/v1/webhooks", headers=auth).json()["data"] == []
    assert client.delete(f"/v1/webhooks/{created['id']}", headers=auth).status_code == 404


@pytest.mark.parametrize("url", [
    "http://169.254.169.254/latest/meta-data",   # cloud metadata
    "http://metadata.google.internal/hook",
    "http://[::1]:8080/hook",                    # loopback not listed in CAHP_ALLOWED_OUTBOUND_HOSTS
    "ftp://example.org/hook",
    "http://user:pass@example.org/hook",
    "not a url",
])
def test_targets_the_outbound_guard_refuses_are_422(client: TestClient, auth: dict[str, str], url: str,
                                                    settings: Settings) -> None:
    response = client.post("/v1/webhooks", json={"url": url}, headers=auth)
    assert response.status_code == 422 and response.json()["code"] == "outbound_url_refused", response.text
    job = client.post("/v1/jobs", json={"model": {"uri": "hf://a/b"}, "dataset": {"uri": "hf://datasets/c/d"},
                                        "notify_url": url}, headers=auth)
    assert job.status_code == 422 and job.json()["code"] == "outbound_url_refused"


def test_a_signed_job_succeeded_reaches_the_receiver_and_verifies_with_the_secret(
    client: TestClient, auth: dict[str, str], engine: Engine, settings: Settings, receiver: Receiver
) -> None:
    secret = _register(client, auth, receiver.url)["secret"]
    job_id = submit(client, auth, settings, labels={"git/commit": "4f2c9e1"})
    start(engine, job_id)
    progress(engine, job_id, "signatures", 0.2)
    progress(engine, job_id, "signatures", 0.4)  # the same stage again: no second event
    finish(engine, job_id)
    assert _dispatch(engine, settings) == ["delivered", "delivered"]
    assert [json.loads(d.body)["type"] for d in receiver.deliveries] == ["job.stage_changed", "job.succeeded"]
    delivery = receiver.of_type("job.succeeded")[0]
    payload = Verifier(secret).verify(delivery.body, delivery.headers)
    assert payload["data"]["id"] == job_id and payload["data"]["status"] == "succeeded"
    assert payload["data"]["labels"] == {"git/commit": "4f2c9e1"} and payload["data"]["result"] == {"k_star": 2}
    assert delivery.headers["webhook-id"].startswith("msg_")
    with pytest.raises(WebhookVerificationError):
        Verifier("whsec_" + "A" * 43).verify(delivery.body, delivery.headers)
    listed = client.get(f"/v1/jobs/{job_id}/deliveries", headers=auth).json()["data"]
    assert [(d["event"], d["status"], len(d["attempts"])) for d in listed] == [
        ("job.stage_changed", "delivered", 1), ("job.succeeded", "delivered", 1)]
    assert listed[1]["webhook_id"] == delivery.headers["webhook-id"] and listed[1]["attempts"][0]["status_code"] == 200
    assert _dispatch(engine, settings) == []  # nothing left to send


def test_a_job_notify_url_is_signed_with_the_key_default_secret(
    client: TestClient, auth: dict[str, str], engine: Engine, settings: Settings, receiver: Receiver
) -> None:
    job_id = submit(client, auth, settings, notify_url=receiver.url)
    secret = client.get("/v1/webhooks/default/secret", headers=auth).json()["secret"]
    assert secret == client.get("/v1/webhooks/default/secret", headers=auth).json()["secret"]
    assert client.post(f"/v1/jobs/{job_id}/cancel", headers=auth).json()["status"] == "cancelled"
    assert _dispatch(engine, settings) == ["delivered"]
    payload = Verifier(secret).verify(receiver.deliveries[0].body, receiver.deliveries[0].headers)
    assert payload["type"] == "job.cancelled" and payload["data"]["id"] == job_id


def test_a_receiver_that_is_down_gets_the_event_once_it_is_back_with_the_same_webhook_id(
    client: TestClient, auth: dict[str, str], engine: Engine, settings: Settings, receiver: Receiver
) -> None:
    secret = _register(client, auth, receiver.url, events=["job.failed"])["secret"]
    receiver.stop()
    job_id = submit(client, auth, settings)
    start(engine, job_id)
    finish(engine, job_id, status=JobStatus.failed)
    assert _retried(engine, settings) == [None]  # refused: no status code
    receiver.status = 503
    receiver.start()
    assert _retried(engine, settings) == [503]
    receiver.status = 200
    assert _dispatch(engine, settings) == ["delivered"]
    assert _dispatch(engine, settings) == []
    ids = {d.headers["webhook-id"] for d in receiver.deliveries}
    assert len(receiver.deliveries) == 2 and len(ids) == 1  # the 503 and the 200, one message
    last = receiver.deliveries[-1]
    assert Verifier(secret).verify(last.body, last.headers)["type"] == "job.failed"
    attempts = client.get(f"/v1/jobs/{job_id}/deliveries", headers=auth).json()["data"][0]["attempts"]
    assert [(a["delivered"], a["status_code"]) for a in attempts] == [(False, None), (False, 503), (True, 200)]


def test_a_delivery_ends_failed_after_the_retry_period(
    client: TestClient, auth: dict[str, str], engine: Engine, tmp_path: Path, receiver: Receiver
) -> None:
    settings = service_settings(tmp_path, allowed_outbound_hosts=("127.0.0.1",), webhook_interval_s=0.0,
                                webhook_retry_initial_s=0.05, webhook_retry_period_s=0.01)
    _register(client, auth, receiver.url)
    receiver.status = 500
    job_id = submit(client, auth, settings)
    client.post(f"/v1/jobs/{job_id}/cancel", headers=auth)
    assert _dispatch(engine, settings) == ["failed"]
    assert client.get(f"/v1/jobs/{job_id}/deliveries", headers=auth).json()["data"][0]["status"] == "failed"


def test_deleting_an_endpoint_ends_its_pending_deliveries(
    client: TestClient, auth: dict[str, str], engine: Engine, settings: Settings, receiver: Receiver
) -> None:
    endpoint = _register(client, auth, receiver.url)
    job_id = submit(client, auth, settings)
    client.post(f"/v1/jobs/{job_id}/cancel", headers=auth)
    client.delete(f"/v1/webhooks/{endpoint['id']}", headers=auth)
    assert _dispatch(engine, settings) == []
    assert receiver.deliveries == []
    assert client.get(f"/v1/jobs/{job_id}/deliveries", headers=auth).json()["data"][0]["status"] == "failed"


def test_no_listener_no_event(client: TestClient, auth: dict[str, str], engine: Engine, settings: Settings) -> None:
    job_id = submit(client, auth, settings)
    client.post(f"/v1/jobs/{job_id}/cancel", headers=auth)
    assert client.get(f"/v1/jobs/{job_id}/deliveries", headers=auth).json()["data"] == []
    assert client.get("/v1/jobs/nope/deliveries", headers=auth).status_code == 404


def test_a_receivers_retry_after_is_read_as_seconds_or_as_a_date(settings: Settings) -> None:
    import datetime as dt
    from email.utils import format_datetime

    in_two_minutes = format_datetime(dt.datetime.now(dt.UTC) + dt.timedelta(seconds=120), usegmt=True)
    assert 100 < (_retry_after(httpx.Response(503, headers={"retry-after": in_two_minutes})) or 0) <= 120
    assert _retry_after(httpx.Response(429, headers={"retry-after": "30"})) == 30
    assert _retry_after(httpx.Response(503, headers={"retry-after": "soon"})) is None
    assert _retry_after(httpx.Response(503)) is None
    # The next try waits at least what the receiver asked (less 10 % jitter), however early in the
    # back-off, and never longer than the cap.
    assert 99 <= backoff_s(1, Settings(), retry_after=110) <= 121
    assert backoff_s(1, settings, retry_after=110) <= settings.webhook_retry_max_s * 1.1
