"""A job watched the ways CI and platforms watch it, on a real ``cahp serve`` with its embedded worker:
``cahp wait --follow``, the event stream, a signed webhook to a receiver on loopback, and ``/metrics``
(whose job counters come from the worker process, through the shared multiprocess directory)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from standardwebhooks.webhooks import Webhook as Verifier

from app.cli import main
from tests.support.helpers import write_tiny_dataset, write_tiny_model
from tests.support.processes import serving, wait_for
from tests.support.receiver import Receiver


def _metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    samples = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
        assert family.name.startswith("cahp_"), family.name
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def _read_events(url: str, key: str, job_id: str, into: list[tuple[str, dict]]) -> None:
    with httpx.stream("GET", f"{url}/v1/jobs/{job_id}/events", headers={"Authorization": f"Bearer {key}"},
                      timeout=120) as response:
        kind = ""
        for line in response.iter_lines():
            if line.startswith("event: "):
                kind = line[len("event: "):]
            elif line.startswith("data: "):
                into.append((kind, json.loads(line[len("data: "):])))


def test_a_job_is_followed_streamed_notified_and_counted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inputs = tmp_path / "inputs"
    model, data = write_tiny_model(inputs / "model"), write_tiny_dataset(inputs / "data")
    with (serving(tmp_path, allowed_local_roots=str(inputs), allowed_outbound_hosts="127.0.0.1",
                  webhook_interval_s="0.2", events_poll_s="0.2", progress_interval_s="0.2") as served,
          Receiver() as receiver):
        url, key, auth, log, common = served.url, served.key, served.auth, served.log, served.cli
        secret = httpx.post(f"{url}/v1/webhooks", json={"url": receiver.url}, headers=auth).json()["secret"]
        before = _metrics(url)

        assert main(["submit", "--model", f"file://{model}", "--dataset", f"file://{data}", "--param", "epochs=1",
                     "--param", "dense_finetune=\"never\"", "--param", "untrained_dense=\"warn\"",
                     "--param", "max_length=32", "--label", "branch=main",
                     *common]) == 0
        job_id = capsys.readouterr().out.strip()
        streamed: list[tuple[str, dict]] = []
        reader = threading.Thread(target=_read_events, args=(url, key, job_id, streamed))
        reader.start()
        assert main(["wait", job_id, "--follow", "--timeout", "240", *common]) == 0, log.read_text()[-3000:]
        followed = capsys.readouterr().out.splitlines()
        reader.join(60)

        # `wait --follow` printed the job's log, every line once, in order.
        lines = [entry["message"] for entry in httpx.get(f"{url}/v1/jobs/{job_id}/logs", headers=auth).json()["data"]]
        assert followed == lines and lines[0].startswith("attempt 1") and lines[-1].startswith("succeeded; stored")
        # The stream saw the job run and ended with its terminal status.
        assert streamed[-1][0] == "status" and streamed[-1][1]["status"] == "succeeded"
        assert {"stage", "log"} <= {kind for kind, _ in streamed}
        # The receiver got a job.succeeded signed with the endpoint's secret, and the stage changes.
        delivery = receiver.wait_for("job.succeeded")
        payload = Verifier(secret).verify(delivery.body, delivery.headers)
        assert payload["data"]["id"] == job_id and payload["data"]["labels"] == {"branch": "main"}
        assert receiver.of_type("job.stage_changed")
        # Metrics moved: the API's own, the database gauges and the worker's (another process).
        wait_for(lambda: _metrics(url).get(("cahp_webhook_deliveries_total", (("outcome", "delivered"),)), 0) > 0,
                 timeout=30, what="the delivery to be counted")
        after = _metrics(url)
        assert after[("cahp_jobs", (("status", "succeeded"),))] == before[("cahp_jobs", (("status", "succeeded"),))] + 1
        assert after[("cahp_jobs_finished_total", (("status", "succeeded"),))] == 1
        assert after[("cahp_job_queue_wait_seconds_count", ())] == 1
        assert after[("cahp_job_stage_duration_seconds_count", (("stage", "signatures"),))] == 1
        submits = ("cahp_http_request_duration_seconds_count",
                   (("method", "POST"), ("route", "/v1/jobs"), ("status", "202")))
        assert after[submits] == before.get(submits, 0) + 1

        # Labels select it; deleting it removes its files.
        assert main(["jobs", "--label", "branch=main", "--json", *common]) == 0
        assert [job["id"] for job in json.loads(capsys.readouterr().out)] == [job_id]
        assert (tmp_path / "cahp-data" / "artifacts" / "jobs" / job_id).is_dir()
        assert main(["delete", job_id, *common]) == 0
        assert not (tmp_path / "cahp-data" / "artifacts" / "jobs" / job_id).exists()
        assert main(["status", job_id, *common]) == 2  # 404: a client error
