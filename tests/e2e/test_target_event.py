"""A FLOPs-target job on a real ``cahp serve`` with its embedded worker: the event stream sends the target's
record (what each layer keeps, the predicted speed-up) as soon as the run has pruned to it, while the run
goes on; the stage changes after it carry the record to a webhook receiver too.

The job asks for a recovery of 1000 epochs; the client cancels it once the stream shows it in recovery. The
target's event came before that one, so a platform had the record while recovery ran, not with the job's end.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import httpx

from tests.support.helpers import job_body, write_tiny_dataset, write_tiny_model
from tests.support.processes import serving, wait_for
from tests.support.receiver import Receiver


def _follow(url: str, auth: dict[str, str], job_id: str, into: list[tuple[str, Any]]) -> None:
    """Read the job's event stream to its end; cancel the job once it is seen in recovery."""
    with httpx.stream("GET", f"{url}/v1/jobs/{job_id}/events", headers=auth, timeout=300) as response:
        kind = ""
        for line in response.iter_lines():
            if line.startswith("event: "):
                kind = line[len("event: "):]
            elif line.startswith("data: "):
                data = json.loads(line[len("data: "):])
                into.append((kind, data))
                if kind in ("status", "stage", "progress") and data["stage"] == "recovery" \
                        and not data["cancel_requested"]:
                    assert httpx.post(f"{url}/v1/jobs/{job_id}/cancel", headers=auth, timeout=30).status_code == 202


def test_the_stream_sends_the_target_once_decided_before_recovery(tmp_path: Path) -> None:
    inputs = tmp_path / "inputs"
    model, data = write_tiny_model(inputs / "model"), write_tiny_dataset(inputs / "data")
    with (serving(tmp_path, allowed_local_roots=str(inputs), allowed_outbound_hosts="127.0.0.1",
                  webhook_interval_s="0.2", events_poll_s="0.2", progress_interval_s="0.2",
                  cancel_check_interval_s="0.2") as served,
          Receiver() as receiver):
        url, auth, log = served.url, served.auth, served.log
        assert httpx.post(f"{url}/v1/webhooks", json={"url": receiver.url, "events": ["job.stage_changed"]},
                          headers=auth).status_code == 201
        body = job_body(f"file://{model}", f"file://{data}", target_flops=0.5, target_seq_len=16,
                        stability_shards=0, recovery="finetune", epochs=1000)
        answer = httpx.post(f"{url}/v1/jobs", json=body, headers=auth, timeout=60)
        assert answer.status_code == 202, answer.text
        job_id = answer.json()["id"]
        streamed: list[tuple[str, Any]] = []
        reader = threading.Thread(target=_follow, args=(url, auth, job_id, streamed))
        reader.start()
        reader.join(600)
        assert not reader.is_alive(), log.read_text()[-3000:]

        kinds = [kind for kind, _ in streamed]
        assert kinds.count("target") == 1, kinds
        assert kinds[-1] == "status" and streamed[-1][1]["status"] == "cancelled", log.read_text()[-3000:]
        in_recovery = next(i for i, (kind, data) in enumerate(streamed)
                           if kind in ("status", "stage", "progress") and data["stage"] == "recovery")
        assert kinds.index("target") < in_recovery
        target = streamed[kinds.index("target")][1]
        # The record: a FLOPs target, kept within it, two layers' counts of the tiny model's four heads.
        assert (target["kind"], target["target"], target["runtime"]) == ("flops", 0.5, "analytic")
        assert target["flops_kept"] <= 0.5 and target["predicted_speedup"] >= 2.0
        assert len(target["heads_per_layer"]) == len(target["neurons_per_layer"]) == 2
        assert sum(target["heads_per_layer"]) < 2 * target["heads_total"]
        # The job says the same; it was cancelled in its recovery.
        job = httpx.get(f"{url}/v1/jobs/{job_id}", headers=auth).json()
        assert job["target"] == target and (job["status"], job["stage"]) == ("cancelled", "recovery")
        assert streamed[-1][1]["target"] == target
        lines = [entry["message"] for entry in httpx.get(f"{url}/v1/jobs/{job_id}/logs", headers=auth).json()["data"]]
        assert any(line.startswith("FLOPs target 0.5: kept") for line in lines)

        # The webhook of the stage changes after the surgery carries the record; those up to it, none.
        wait_for(lambda: any(json.loads(d.body)["data"]["stage"] == "recovery"
                             for d in receiver.of_type("job.stage_changed")),
                 timeout=60, what="the change to recovery to be delivered", log=log)
        by_stage = {json.loads(d.body)["data"]["stage"]: json.loads(d.body)["data"]
                    for d in receiver.of_type("job.stage_changed")}
        assert by_stage["surgery"]["target"] is None and by_stage["load"]["target"] is None
        assert by_stage["recovery"]["target"] == target
