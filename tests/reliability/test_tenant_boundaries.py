"""What one key holder can do to the service or to what others read, replayed on real processes.

A real ``cahp serve`` and ``cahp worker`` on the stack's database and queue. A job whose name and labels
are written to break its model card (HTML, a heading, a comment left open to hide the quality warnings);
its signed links after its key is revoked (with ``cahp keys revoke``, which also ends the key's queued
jobs); a forged link for a job that exists and one that does not (the database is not read for either);
five identical uploads at once; request bodies nested thousands deep; the retry schedule of a delivery
to a closed port and to one that never answers.
"""

from __future__ import annotations

import io
import socket
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from markdown_it import MarkdownIt
from sqlalchemy import Engine, delete, event, text

from app.api.background import dispatch_once
from app.core.db import WebhookDelivery, transaction
from tests.support.helpers import free_port, new_key
from tests.support.processes import stop
from tests.support.stack import TERMINAL, Server, Stack, settings_env, start_server

TINY = {"epochs": 1, "dense_finetune": "never", "untrained_dense": "warn", "batch_size": 16, "max_length": 32,
        "seed": 0, "export": "none",
        "latency_repeats": 1}
HOSTILE_NAME = "<img src=x onerror=alert(1)> ## Not a heading <!--"
HOSTILE_LABELS = {"team": "<script>alert(1)</script>", "note": "# fake heading -->"}
#: Loopback receivers for the retry schedule; deliveries are sent by the test alone (no dispatcher loop).
STACK_SETTINGS: dict[str, Any] = {"allowed_outbound_hosts": ("127.0.0.1",), "webhook_interval_s": 0.0}


@pytest.fixture(scope="module")
def server(stack: Stack) -> Iterator[Server]:
    served = start_server(stack.settings, stack.root / "serve.log", webhook_interval_s=0.0)
    try:
        yield served
    finally:
        stop(served.process, grace_s=10)


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _body(stack: Stack, **extra: Any) -> dict[str, Any]:
    model, data = stack.inputs()
    return {"model": {"uri": model}, "dataset": {"uri": data}, "params": TINY, **extra}


def _card(tarball: bytes) -> str:
    with tarfile.open(fileobj=io.BytesIO(tarball)) as archive:
        member = next(m for m in archive.getmembers() if m.name.endswith("README.md"))
        handle = archive.extractfile(member)
        assert handle is not None
        return handle.read().decode()


def test_a_card_cannot_be_rewritten_and_a_revoked_keys_links_and_queued_jobs_end(stack: Stack,
                                                                                   server: Server) -> None:
    key = new_key(stack.engine, "leaving")
    with httpx.Client(base_url=server.url, headers=_bearer(key), timeout=60) as client:
        submitted = client.post("/v1/jobs", json=_body(stack, name=HOSTILE_NAME, labels=HOSTILE_LABELS))
        assert submitted.status_code == 202, submitted.text
        job_id = submitted.json()["id"]
        worker = stack.start_worker("boundaries")
        stack.wait_ready(worker)
        done = stack.wait_row(job_id, lambda r: r["status"] in TERMINAL, timeout=300, what="the job to end")
        assert done["status"] == "succeeded", done
        stop(worker.process, grace_s=10)
        stack.workers.remove(worker)

        # The card: the name and labels read as text; no tag, comment or heading of theirs is in it.
        card = _card(client.get(f"/v1/jobs/{job_id}/artifacts/model.tar.gz").content)
        body = card.split("\n---\n", 1)[1]
        assert "<img" not in body and "<script" not in body and "<!--" not in body and "-->" not in body
        html = MarkdownIt("commonmark").render(body)
        assert html.count("<h1>") == 1 and "<img" not in html and "<script" not in html and "<!--" not in html
        assert "Quality warnings" in html.split("<h2>")[0]  # shown, right under the title
        assert "&lt;img src=x onerror=alert(1)&gt;" in html.split("</h1>")[0]

        # Two more jobs wait in the queue (no worker), and a link is handed out.
        waiting = [client.post("/v1/jobs", json=_body(stack)).json()["id"] for _ in range(2)]
        link = {a["name"]: a["signed_url"] for a in client.get(f"/v1/jobs/{job_id}/artifacts").json()["data"]}
        signed = link["report.json"]
        assert httpx.get(signed, timeout=60).status_code == 200

    env = settings_env(stack.settings)
    revoked = subprocess.run([sys.executable, "-m", "app.cli", "keys", "revoke", "leaving"], env=env,
                             capture_output=True, text=True, timeout=120)
    assert revoked.returncode == 0, revoked.stderr
    assert "2 queued job(s) cancelled" in revoked.stderr, revoked.stderr
    for waiting_id in waiting:
        row = stack.row(waiting_id)
        assert row["status"] == "cancelled" and "API key was revoked" in row["error_message"], row
    dead = httpx.get(signed, timeout=60)
    assert dead.status_code == 403 and dead.json()["code"] == "link_invalid", dead.text


def test_a_forged_link_is_refused_before_the_database_is_read(stack: Stack) -> None:
    job_id = stack.submit(**TINY)
    key_id = stack.row(job_id)["owner_id"]
    forged = urlencode({"key": key_id, "expires": 4_000_000_000, "signature": "0" * 64})
    statements: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        # The API's own periodic duties (the sweeper, the webhook dispatcher: threads named cahp-*) may read
        # rows at any moment; only what serving the request reads counts.
        if not threading.current_thread().name.startswith("cahp-"):
            statements.append(statement)

    event.listen(Engine, "before_cursor_execute", count)
    try:
        for target in (job_id, "f" * 32):
            statements.clear()
            refused = stack.client.get(f"/v1/artifacts/{target}/report.json?{forged}", headers={"Authorization": ""})
            assert refused.status_code == 403 and refused.json()["code"] == "link_invalid", refused.text
            # The same work for a job that exists and one that does not: no row is read for either.
            assert statements == [], (target, statements)
    finally:
        event.remove(Engine, "before_cursor_execute", count)
    stack.client.post(f"/v1/jobs/{job_id}/cancel")


def test_five_identical_uploads_at_once_store_one_copy(stack: Stack, server: Server) -> None:
    key = new_key(stack.engine, "uploader")
    content = ("text,label\n" + "".join(f"row {i} of the same file,{i % 3}\n" for i in range(3000))).encode()
    answers: list[httpx.Response] = []
    start = threading.Barrier(5)

    def upload() -> None:
        with httpx.Client(base_url=server.url, headers=_bearer(key), timeout=120) as client:
            start.wait()
            answers.append(client.post("/v1/uploads", files={"file": ("same.csv", content)}))

    threads = [threading.Thread(target=upload) for _ in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(a.status_code in (200, 201) for a in answers), [a.text for a in answers]
    assert len({a.json()["id"] for a in answers}) == 1, [a.json()["id"] for a in answers]
    assert sorted(a.status_code for a in answers) == [200, 200, 200, 200, 201]
    with stack.engine.connect() as connection:
        owner = connection.execute(text("SELECT id FROM api_keys WHERE name = 'uploader'")).scalar_one()
        rows = connection.execute(text("SELECT count(*) FROM uploads WHERE owner_id = :o"), {"o": owner}).scalar()
    assert rows == 1
    stored = [p for p in (stack.settings.data_dir / "artifacts" / "uploads").iterdir()
              if p.stat().st_size == len(content)]
    assert len(stored) == 1


def test_bodies_nested_thousands_deep_are_refused_as_input(stack: Stack, server: Server) -> None:
    key = new_key(stack.engine, "nester")
    deep = "[" * 50_000 + "]" * 50_000
    labels = '{"model": {"uri": "x"}, "dataset": {"uri": "y"}, "labels": ' + '{"a":' * 5000 + '"v"' + "}" * 5001
    with httpx.Client(base_url=server.url, headers=_bearer(key), timeout=60) as client:
        for path, body in (("/v1/jobs", deep), ("/v1/jobs/check", labels), ("/v1/webhooks", deep),
                           ("/v1/jobs", labels)):
            refused = client.post(path, content=body, headers={"content-type": "application/json"})
            assert refused.status_code == 400 and refused.json()["code"] == "nesting_too_deep", (path, refused.text)
            assert "flatter" in refused.json()["detail"]
        assert client.get("/healthz").status_code == 200


def _hanging_port() -> tuple[int, socket.socket]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)  # accepts connections (the kernel's backlog) and never answers
    return listener.getsockname()[1], listener


def test_a_closed_port_and_a_hanging_one_are_retried_on_the_same_schedule(stack: Stack) -> None:
    settings = stack.settings.model_copy(update={"webhook_timeout_s": 2.0, "webhook_retry_initial_s": 0.05})
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)  # takes connections (into the kernel's backlog) and never answers
    key = new_key(stack.engine, "prober")
    try:
        for port in (free_port(), listener.getsockname()[1]):
            job = stack.client.post("/v1/jobs", json=_body(stack, notify_url=f"http://127.0.0.1:{port}/hook"),
                                    headers=_bearer(key))
            assert job.status_code == 202, job.text
            assert stack.client.post(f"/v1/jobs/{job.json()['id']}/cancel", headers=_bearer(key)).status_code == 202
        attempts = dispatch_once(sessions=stack.sessions, settings=settings)
        assert len(attempts) == 2 and all(a.outcome == "retry" for a in attempts), attempts
        gaps = sorted((a.next_attempt_at - a.attempted_at).total_seconds() for a in attempts if a.next_attempt_at)
        # Both wait at least the longest an attempt may take: the schedule does not tell which port answered.
        assert len(gaps) == 2 and gaps[0] >= settings.webhook_timeout_s, gaps
    finally:
        listener.close()
        with transaction(stack.sessions) as session:
            session.execute(delete(WebhookDelivery))
