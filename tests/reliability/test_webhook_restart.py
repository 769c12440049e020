"""The outbox is durable: an event whose receiver was down is delivered by the next ``cahp serve``,
after a restart, with the ``webhook-id`` its failed attempts had, and a valid signature."""

from __future__ import annotations

from pathlib import Path

import httpx
from standardwebhooks.webhooks import Webhook as Verifier

from tests.support.helpers import job_body, migrated_engine, new_key, service_settings
from tests.support.jobs import finish, start
from tests.support.processes import stop, wait_for
from tests.support.receiver import Receiver
from tests.support.stack import start_server


def test_an_undelivered_event_is_delivered_after_a_restart_with_the_same_webhook_id(tmp_path: Path) -> None:
    settings = service_settings(tmp_path, allowed_outbound_hosts=("127.0.0.1",), webhook_interval_s=0.2,
                                webhook_retry_initial_s=0.2, webhook_retry_max_s=0.5)
    engine = migrated_engine(settings)
    key = new_key(engine, "platform")
    auth = {"Authorization": f"Bearer {key}"}
    receiver = Receiver()  # its port is known, nothing listens on it yet
    api = start_server(settings, tmp_path / "api-1.log")
    try:
        secret = httpx.post(f"{api.url}/v1/webhooks", json={"url": receiver.url}, headers=auth).json()["secret"]
        job_id = httpx.post(f"{api.url}/v1/jobs", json=job_body("hf://org/model", "hf://datasets/org/data"),
                            headers=auth).json()["id"]
        start(engine, job_id)
        finish(engine, job_id)  # a worker's end of the job: the event is written with it

        def attempts() -> list[dict]:
            return list(httpx.get(f"{api.url}/v1/jobs/{job_id}/deliveries", headers=auth).json()["data"])

        wait_for(lambda: len(attempts()[0]["attempts"]) >= 2, timeout=60, what="two failed attempts", log=api.log)
        first = attempts()[0]
        assert first["status"] == "pending" and all(a["status_code"] is None for a in first["attempts"])
        stop(api.process)

        receiver.start()
        api = start_server(settings, tmp_path / "api-2.log")
        delivery = receiver.wait_for("job.succeeded")
        assert delivery.headers["webhook-id"] == first["webhook_id"]
        assert Verifier(secret).verify(delivery.body, delivery.headers)["data"]["id"] == job_id
        wait_for(lambda: attempts()[0]["status"] == "delivered", timeout=30, what="the delivery record", log=api.log)
        assert len(receiver.deliveries) == 1
    finally:
        receiver.stop()
        stop(api.process)
        engine.dispose()
