"""``GET /v1/jobs/{id}/events``: the job's state and log as Server-Sent Events, resumable."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from app.core.db import make_session_factory, repository, transaction
from app.core.settings import Settings
from tests.support.helpers import service_settings
from tests.support.jobs import finish, progress, start, submit


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return service_settings(tmp_path, events_poll_s=0.05)


def _events_while(work, client: TestClient, auth: dict[str, str], job_id: str) -> list[tuple[str, str, dict]]:
    """The whole stream, read while ``work(seen)`` (the worker's writes) runs in a thread.

    ``seen(kind, **fields)`` waits until the stream has sent an event ``kind`` whose data has those fields, so
    the writer moves on once the stream has read its last write: however slowly the stream polls on a busy
    machine, no state is overwritten before it was read (a write it never shows fails the test's assertions).
    """
    arrived = threading.Condition()
    so_far: list[tuple[str, str, dict]] = []

    def heard(found: list[tuple[str, str, dict]]) -> None:
        with arrived:
            so_far[:] = found
            arrived.notify_all()

    def seen(kind: str, **fields: object) -> None:
        with arrived:
            arrived.wait_for(lambda: any(k == kind and all(d.get(n) == v for n, v in fields.items())
                                         for _, k, d in so_far), timeout=120)

    writer = threading.Thread(target=work, args=(seen,))
    writer.start()
    try:
        return _events(client, auth, job_id, heard=heard)
    finally:
        writer.join()


def _events(client: TestClient, auth: dict[str, str], job_id: str, last_event_id: str | None = None, *,
            heard=lambda _found: None) -> list[tuple[str, str, dict]]:
    """Read the whole stream: ``(id, event, data)`` of each event, in order; ``heard`` is told after each."""
    headers = {**auth, **({"Last-Event-ID": last_event_id} if last_event_id is not None else {})}
    found: list[tuple[str, str, dict]] = []
    with client.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        fields: dict[str, str] = {}
        for line in response.iter_lines():
            if not line:
                if "data" in fields:
                    found.append((fields["id"], fields["event"], json.loads(fields["data"])))
                    heard(found)
                fields = {}
            elif not line.startswith(":"):
                name, _, value = line.partition(": ")
                fields[name] = value
    return found


def test_the_stream_of_a_running_job_ends_with_its_terminal_status(
    client: TestClient, auth: dict[str, str], engine: Engine, settings: Settings
) -> None:
    job_id = submit(client, auth, settings)
    start(engine, job_id)

    def work(seen) -> None:  # the worker's writes, while the client listens, each once the stream showed the last
        seen("status", status="running")
        for kind, stage, fraction, line in (("stage", "load", 0.0, "loading"),
                                            ("stage", "signatures", 0.5, "signatures"),
                                            ("progress", "signatures", 0.9, "almost")):
            progress(engine, job_id, stage, fraction, messages=(line,))
            seen(kind, stage=stage)
        finish(engine, job_id, messages=["done"])

    events = _events_while(work, client, auth, job_id)
    kinds = [kind for _, kind, _ in events]
    assert kinds[0] == "status" and events[0][2]["status"] == "running"
    assert kinds[-1] == "status" and events[-1][2]["status"] == "succeeded"
    assert [data["message"] for _, kind, data in events if kind == "log"] == ["loading", "signatures", "almost", "done"]
    assert [data["stage"] for _, kind, data in events if kind == "stage"] == ["load", "signatures"]
    assert "progress" in kinds
    # ids count the log lines sent, so they never go down
    ids = [int(event_id) for event_id, _, _ in events]
    assert ids == sorted(ids) and ids[-1] == 4


def test_last_event_id_resumes_after_the_lines_already_received(
    client: TestClient, auth: dict[str, str], engine: Engine, settings: Settings
) -> None:
    job_id = submit(client, auth, settings)
    start(engine, job_id)
    progress(engine, job_id, "load", 0.1, messages=("one", "two", "three"))
    finish(engine, job_id, messages=["four"])
    everything = _events(client, auth, job_id)
    assert [d["message"] for _, k, d in everything if k == "log"] == ["one", "two", "three", "four"]
    resumed = _events(client, auth, job_id, last_event_id="2")
    assert [d["message"] for _, k, d in resumed if k == "log"] == ["three", "four"]
    assert resumed[-1][1] == "status" and resumed[-1][2]["status"] == "succeeded"
    # An id this server never gave out starts from the beginning rather than failing.
    assert len([k for _, k, _ in _events(client, auth, job_id, last_event_id="abc") if k == "log"]) == 4


def test_unknown_jobs_and_missing_keys(client: TestClient, auth: dict[str, str]) -> None:
    assert client.get("/v1/jobs/nope/events", headers=auth).status_code == 404
    assert client.get("/v1/jobs/nope/events").status_code == 401


def test_a_target_decided_while_the_job_runs_is_an_event_before_its_end_and_again_after_a_reconnect(
    client: TestClient, auth: dict[str, str], engine: Engine, settings: Settings
) -> None:
    job_id = submit(client, auth, settings)
    start(engine, job_id)
    decided = {"kind": "flops", "target": 0.5, "runtime": "analytic", "heads_per_layer": [1, 3],
               "neurons_per_layer": [20, 0], "heads_total": 4, "neurons_total": 37, "predicted_speedup": 2.4,
               "measured_speedup": None}
    sessions = make_session_factory(engine)

    def work(_seen) -> None:  # the worker's writes, while the client listens
        progress(engine, job_id, "surgery", 0.5, messages=("FLOPs target 0.5: kept 41%",))
        time.sleep(0.2)
        with transaction(sessions) as session:
            assert repository.report_target(session, job_id=job_id, worker_id="w", target=decided)
            # A worker that does not hold the job writes nothing.
            assert not repository.report_target(session, job_id=job_id, worker_id="other", target={"kind": "x"})
        time.sleep(0.2)
        progress(engine, job_id, "recovery", 0.7, messages=("recovery: epoch 1",))
        time.sleep(0.2)
        finish(engine, job_id, messages=["done"])

    events = _events_while(work, client, auth, job_id)
    kinds = [kind for _, kind, _ in events]
    assert kinds.count("target") == 1 and kinds.index("target") < len(kinds) - 1
    shown = events[kinds.index("target")][2]
    assert {name: shown[name] for name in decided} == decided
    assert events[-1][2]["status"] == "succeeded" and events[-1][2]["target"] == shown
    assert client.get(f"/v1/jobs/{job_id}", headers=auth).json()["target"] == shown
    # A client that reconnects after the target's event gets it again, before the job's state.
    resumed = _events(client, auth, job_id, last_event_id=events[kinds.index("target")][0])
    assert [kind for _, kind, _ in resumed if kind != "log"] == ["target", "status"]


def test_a_job_without_a_target_sends_no_target_event(
    client: TestClient, auth: dict[str, str], engine: Engine, settings: Settings
) -> None:
    job_id = submit(client, auth, settings)
    start(engine, job_id)
    finish(engine, job_id)
    assert "target" not in [kind for _, kind, _ in _events(client, auth, job_id)]
    assert client.get(f"/v1/jobs/{job_id}", headers=auth).json()["target"] is None
