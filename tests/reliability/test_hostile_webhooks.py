"""A key holder turned attacker through webhooks: each test replays one attack against the real service
(the app, its dispatcher, real sockets on loopback) and shows it fails.

The attacks: a receiver that trickles its answer one byte a second to hold deliveries, and with them
every other key's; URLs with CR, LF, TAB or other invisible characters that no delivery could send;
a URL that makes the HTTP client raise; many registrations at once to pass the per-key endpoint limit;
attempt records read to map which internal hosts and ports answer; receivers at multicast,
broadcast, reserved, private or the server's own addresses; and a DNS answer that changes between
the guard's check and the connection (rebinding).
"""

from __future__ import annotations

import ipaddress
import itertools
import json
import logging
import math
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, func, update
from sqlalchemy import select as sql_select

from app.api.background import dispatch_once
from app.api.main import create_app
from app.api.schemas import WebhookCreate
from app.api.services.webhooks import MAX_WEBHOOKS, create_webhook
from app.core.db import ApiKey, Webhook, WebhookDelivery, make_session_factory, transaction, utcnow
from app.core.errors import InvalidRequestError
from app.core.security import _outbound as outbound
from app.core.settings import Settings
from tests.support.helpers import (
    free_port,
    job_body,
    migrated_engine,
    new_key,
    postgres_schema_url,
    service_settings,
    write_tiny_dataset,
)
from tests.support.processes import wait_for
from tests.support.receiver import Receiver

#: Every delivery must be over within this (connect, send, status and headers), in these tests.
DEADLINE_S = 2.0


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Loopback receivers allowed (the tests' own), no dispatcher thread unless a test starts the app with one."""
    return service_settings(tmp_path, allowed_outbound_hosts=("127.0.0.1",), webhook_interval_s=0.0,
                            webhook_timeout_s=DEADLINE_S, webhook_retry_initial_s=60.0)


@pytest.fixture
def alice(engine: Engine) -> dict[str, str]:
    return {"Authorization": f"Bearer {new_key(engine, 'alice')}"}


class Trickler:
    """A receiver that reads the request, then answers ``HTTP/1.1 200 OK`` and a header that never ends,
    one byte every ``every`` seconds, until the client hangs up or :meth:`stop`.

    ``spans`` holds ``[accepted, closed]`` (monotonic seconds) for every connection, ``inf`` while open.
    """

    def __init__(self, *, every: float = 1.0) -> None:
        self.every = every
        self.spans: list[list[float]] = []
        self._sockets: list[socket.socket] = []
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def open_at(self, moment: float) -> int:
        return sum(1 for accepted, closed in list(self.spans) if accepted <= moment < closed)

    def stop(self) -> None:
        self._stop.set()
        self._listener.close()
        for sock in list(self._sockets):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            span = [time.monotonic(), math.inf]
            self.spans.append(span)
            self._sockets.append(sock)
            threading.Thread(target=self._serve, args=(sock, span), daemon=True).start()

    def _serve(self, sock: socket.socket, span: list[float]) -> None:
        answer = itertools.chain(b"HTTP/1.1 200 OK\r\nx-slow: ", itertools.repeat(ord("a")))
        try:
            for byte in answer:
                readable, _, _ = select.select([sock], [], [], self.every)
                if self._stop.is_set() or (readable and not sock.recv(65536)):
                    return  # stopped, or the client hung up
                sock.sendall(bytes([byte]))
        except OSError:
            pass
        finally:
            span[1] = time.monotonic()
            sock.close()


@pytest.fixture
def trickler() -> Iterator[Trickler]:
    found = Trickler()
    yield found
    found.stop()  # first: a dispatcher stuck on it could not stop otherwise


def _job(client: TestClient, auth: dict[str, str], settings: Settings, **extra: Any) -> str:
    root = settings.allowed_local_roots[0] / "data"
    if not root.exists():
        write_tiny_dataset(root)
    response = client.post("/v1/jobs", json={**job_body("hf://org/model", f"file://{root}"), **extra}, headers=auth)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def _cancelled_job(client: TestClient, auth: dict[str, str], settings: Settings, **extra: Any) -> str:
    """A job cancelled while queued: its ``job.cancelled`` event goes to every endpoint of the key."""
    job_id = _job(client, auth, settings, **extra)
    assert client.post(f"/v1/jobs/{job_id}/cancel", headers=auth).json()["status"] == "cancelled"
    return job_id


def _register(client: TestClient, auth: dict[str, str], url: str) -> dict[str, Any]:
    response = client.post("/v1/webhooks", json={"url": url}, headers=auth)
    assert response.status_code == 201, response.text
    return dict(response.json())


def _deliveries(client: TestClient, auth: dict[str, str], job_id: str) -> list[dict[str, Any]]:
    return list(client.get(f"/v1/jobs/{job_id}/deliveries", headers=auth).json()["data"])


def _in_thread(work: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(work()), daemon=True)
    thread.start()
    return thread, result


# --- a receiver that trickles ----------------------------------------------------------------------------


def test_a_receiver_trickling_its_answer_is_cut_off_at_the_deadline_and_retried(
    client: TestClient, alice: dict[str, str], engine: Engine, settings: Settings, trickler: Trickler
) -> None:
    _register(client, alice, trickler.url())
    job_id = _cancelled_job(client, alice, settings)
    # Each byte comes well within any per-read timeout; only a deadline on the whole request ends it.
    thread, result = _in_thread(lambda: dispatch_once(sessions=make_session_factory(engine), settings=settings))
    thread.join(timeout=30)
    assert not thread.is_alive(), "the delivery was still receiving one byte a second after 30 s"
    [attempt] = result[0]
    assert attempt.outcome == "retry" and attempt.status_code is None
    [delivery] = _deliveries(client, alice, job_id)
    assert delivery["status"] == "pending" and delivery["next_attempt_at"] is not None  # retried, as any failure
    assert [a["delivered"] for a in delivery["attempts"]] == [False]
    [(accepted, closed)] = trickler.spans
    assert closed - accepted < DEADLINE_S + 10


def test_one_keys_slow_receivers_neither_block_another_keys_delivery_nor_take_every_slot(
    tmp_path: Path, trickler: Trickler
) -> None:
    # Alice's stuck attempts hold their slots until this deadline: Bob's delivery must get through meanwhile,
    # however busy the machine (at 4 s, a loaded 2-core machine could let them all end before it was sent).
    cap, stuck_s = 2, 15.0
    settings = service_settings(tmp_path, allowed_outbound_hosts=("127.0.0.1",), webhook_interval_s=0.2,
                                webhook_timeout_s=stuck_s, webhook_retry_initial_s=60.0, webhook_max_in_flight=4,
                                webhook_max_in_flight_per_key=cap)
    engine = migrated_engine(settings)
    alice = {"Authorization": f"Bearer {new_key(engine, 'alice')}"}
    bob = {"Authorization": f"Bearer {new_key(engine, 'bob')}"}
    fast = Receiver().start()
    try:
        with TestClient(create_app(settings)) as client:  # the app's own dispatcher, in its thread
            try:
                for i in range(6):
                    _register(client, alice, trickler.url(f"/slow/{i}"))
                alice_job = _cancelled_job(client, alice, settings)  # six deliveries, all to the trickler
                wait_for(lambda: len(trickler.spans) >= 1, timeout=30, what="the first slow delivery")
                _register(client, bob, fast.url)
                _cancelled_job(client, bob, settings)

                fast.wait_for("job.cancelled", timeout=stuck_s)  # while Alice's are stuck
                arrived = time.monotonic()
                assert 1 <= trickler.open_at(arrived) <= cap

                # And hers are not lost: each stuck attempt ends at the deadline, is recorded, and waits
                # for its retry, while her other deliveries take the slots.
                def recorded() -> int:
                    return sum(len(d["attempts"]) for d in _deliveries(client, alice, alice_job))

                wait_for(lambda: recorded() >= cap, timeout=stuck_s + 30, what="the stuck attempts recorded")
                # None could end before the deadline, so the connections opened until half a second before it
                # were all open at once: Alice's cap of them, not every slot.
                first = trickler.spans[0][0]
                assert time.monotonic() > first + stuck_s - 0.5
                assert sum(1 for accepted, _ in list(trickler.spans) if accepted < first + stuck_s - 0.5) == cap
                found = _deliveries(client, alice, alice_job)
                assert all(d["status"] == "pending" for d in found)
                assert all(not a["delivered"] for d in found for a in d["attempts"])
            finally:
                trickler.stop()
    finally:
        fast.stop()
        engine.dispose()


# --- URLs no delivery could send -------------------------------------------------------------------------


@pytest.mark.parametrize(("url", "shown"), [
    ("http://127.0.0.1:9/ho\rok", "'\\r'"),
    ("http://127.0.0.1:9/ho\nok", "'\\n'"),
    ("http://127.0.0.1:9/ho\tok", "'\\t'"),
    ("http://127.0.0.1:9/a b", "' '"),
    ("http://127.0.0.1:9/a\u200bb", "'\\u200b'"),  # invisible: a zero-width space
])
def test_whitespace_and_control_characters_in_a_receiver_url_are_a_422(
    client: TestClient, alice: dict[str, str], settings: Settings, url: str, shown: str
) -> None:
    endpoint = client.post("/v1/webhooks", json={"url": url}, headers=alice)
    job = client.post("/v1/jobs", json={**job_body("hf://org/model", "hf://datasets/org/data"), "notify_url": url},
                      headers=alice)
    for response in (endpoint, job):
        assert response.status_code == 422, response.text
        body = response.json()
        assert body["code"] == "outbound_url_refused", body
        assert "whitespace or control characters" in body["detail"] and shown in body["detail"], body["detail"]
        assert "percent-encode" in body["detail"]
    assert client.get("/v1/webhooks", headers=alice).json()["data"] == []


def test_an_exception_inside_a_delivery_is_a_failed_attempt_and_the_retry_period_ends_it(
    client: TestClient, alice: dict[str, str], engine: Engine, tmp_path: Path, settings: Settings
) -> None:
    # A host label longer than 63 characters: the guard cannot resolve it (so it passes), and the HTTP
    # client raises a UnicodeError, outside the errors of a failed request, when it encodes the URL.
    _register(client, alice, f"http://{'a' * 64}.example/hook")
    job_id = _cancelled_job(client, alice, settings)
    sessions = make_session_factory(engine)
    [attempt] = dispatch_once(sessions=sessions, settings=settings)
    assert attempt.outcome == "retry" and "UnicodeError" in (attempt.error or "")
    [delivery] = _deliveries(client, alice, job_id)
    assert delivery["status"] == "pending" and len(delivery["attempts"]) == 1

    # Once its retry period is over, the next such attempt ends it, as it would any failure.
    with transaction(sessions) as session:
        session.execute(update(WebhookDelivery).values(next_attempt_at=utcnow()))
    ended = settings.model_copy(update={"webhook_retry_period_s": 0.001})
    assert [a.outcome for a in dispatch_once(sessions=sessions, settings=ended)] == ["failed"]
    [delivery] = _deliveries(client, alice, job_id)
    assert delivery["status"] == "failed" and len(delivery["attempts"]) == 2


# --- the endpoint limit ----------------------------------------------------------------------------------


def _register_at_once(engine: Engine, settings: Settings, owner_id: str, n: int) -> tuple[int, int]:
    """``n`` registrations for one key in ``n`` threads released together; returns (made, refused)."""
    sessions = make_session_factory(engine)
    barrier = threading.Barrier(n)
    made, refused, failures = [], [], []

    def one(i: int) -> None:
        body = WebhookCreate(url=f"http://127.0.0.1:9/hook/{i}")
        with sessions() as session:
            barrier.wait()
            try:
                made.append(create_webhook(session=session, settings=settings, owner_id=owner_id, body=body))
            except InvalidRequestError:
                refused.append(i)
            except Exception as exc:  # reported below, not lost in a thread
                failures.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not failures, failures
    with sessions() as session:
        stored = session.scalar(sql_select(func.count()).select_from(Webhook).where(Webhook.owner_id == owner_id))
    assert stored == len(made)
    return len(made), len(refused)


def _key_id(engine: Engine, name: str) -> str:
    new_key(engine, name)
    with make_session_factory(engine)() as session:
        return str(session.scalar(sql_select(ApiKey.id).where(ApiKey.name == name)))


def test_concurrent_registrations_never_pass_the_endpoint_limit_on_sqlite(engine: Engine, settings: Settings) -> None:
    assert _register_at_once(engine, settings, _key_id(engine, "racer"), 60) == (MAX_WEBHOOKS, 60 - MAX_WEBHOOKS)


def test_concurrent_registrations_never_pass_the_endpoint_limit_on_postgresql(tmp_path: Path) -> None:
    with postgres_schema_url() as url:
        settings = service_settings(tmp_path, database_url=url, allowed_outbound_hosts=("127.0.0.1",))
        engine = migrated_engine(settings)
        try:
            made = _register_at_once(engine, settings, _key_id(engine, "racer"), 60)
        finally:
            engine.dispose()
    assert made == (MAX_WEBHOOKS, 60 - MAX_WEBHOOKS)


# --- what a key holder may read --------------------------------------------------------------------------


def test_an_attempt_record_says_delivered_or_not_and_the_status_code_only(
    client: TestClient, alice: dict[str, str], engine: Engine, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    closed = f"http://127.0.0.1:{free_port()}/hook"  # nothing listens: "connection refused" would map the port
    _register(client, alice, closed)
    job_id = _cancelled_job(client, alice, settings)
    with caplog.at_level(logging.WARNING, logger="app.api.background._dispatcher"):
        dispatch_once(sessions=make_session_factory(engine), settings=settings)
    [delivery] = _deliveries(client, alice, job_id)
    assert delivery["attempts"] == [{"time": delivery["attempts"][0]["time"], "delivered": False, "status_code": None}]
    text = json.dumps(delivery)
    assert "refused" not in text.lower() and "errno" not in text.lower()
    assert "ConnectError" in caplog.text  # the detail stays in the server's log, for operators


# --- where a receiver may be -----------------------------------------------------------------------------


@pytest.mark.parametrize(("url", "kind"), [
    ("http://224.0.0.251/hook", "multicast"),
    ("http://[ff02::1]/hook", "multicast"),
    ("http://255.255.255.255/hook", "broadcast"),
    ("http://240.0.0.1/hook", "reserved"),
    ("http://10.1.2.3/hook", "private"),
    ("http://172.16.5.4/hook", "private"),
    ("http://192.168.1.10/hook", "private"),
    ("http://[fd12:3456::1]/hook", "private"),
    ("http://[64:ff9b::a01:203]/hook", "private"),  # 10.1.2.3 through NAT64
    ("http://100.64.0.1/hook", "shared"),
    ("http://198.18.0.1/hook", "benchmarking"),
    ("http://[::]/hook", "unspecified"),
    ("http://[3fff::1]/hook", "documentation"),
])
def test_receivers_at_multicast_broadcast_reserved_and_private_addresses_are_refused(
    client: TestClient, alice: dict[str, str], url: str, kind: str
) -> None:
    response = client.post("/v1/webhooks", json={"url": url}, headers=alice)
    assert response.status_code == 422 and response.json()["code"] == "outbound_url_refused", response.text
    assert kind in response.json()["detail"] and "CAHP_ALLOWED_OUTBOUND_HOSTS" in response.json()["detail"]


def test_every_address_of_the_server_itself_is_refused(
    client: TestClient, alice: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import psutil

    ours = {a.address.split("%")[0] for entries in psutil.net_if_addrs().values() for a in entries
            if a.family in (socket.AF_INET, socket.AF_INET6)}
    for address in map(ipaddress.ip_address, ours - {"127.0.0.1"}):  # that one is allowed here
        host = f"[{address}]" if address.version == 6 else str(address)
        response = client.post("/v1/webhooks", json={"url": f"http://{host}/hook"}, headers=alice)
        assert response.status_code == 422, (address, response.text)
    # A public address the server has (a cloud VM's, say) is refused as the server's own.
    public = ipaddress.ip_address("93.184.215.14")
    monkeypatch.setattr(outbound, "interface_addresses", lambda: frozenset({public}))
    response = client.post("/v1/webhooks", json={"url": f"http://{public}/hook"}, headers=alice)
    assert response.status_code == 422 and "an address of this server" in response.json()["detail"], response.text


def test_a_name_is_refused_without_telling_the_address_it_resolves_to(
    client: TestClient, alice: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = socket.getaddrinfo

    def internal_dns(host: Any, *args: Any, **kwargs: Any) -> Any:
        return real("10.9.8.7" if host == "db.corp.test" else host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", internal_dns)
    response = client.post("/v1/webhooks", json={"url": "http://db.corp.test:5432/hook"}, headers=alice)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert "db.corp.test resolves to a private address" in detail and "10.9.8.7" not in detail, detail


def test_an_operator_may_allow_a_private_network(tmp_path: Path, engine: Engine, alice: dict[str, str]) -> None:
    settings = service_settings(tmp_path, allowed_outbound_hosts=("10.0.0.0/8",), webhook_interval_s=0.0)
    with TestClient(create_app(settings)) as client:
        assert client.post("/v1/webhooks", json={"url": "http://10.1.2.3/hook"}, headers=alice).status_code == 201
        assert client.post("/v1/webhooks", json={"url": "http://192.168.1.1/hook"}, headers=alice).status_code == 422


def test_a_dns_answer_that_changes_after_the_check_never_reaches_the_address_it_changed_to(
    alice: dict[str, str], engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 127.0.0.2 stands for a public receiver (the operator allows it); 127.0.0.1, on the same port, for an
    # internal service the guard refuses. The name answers the receiver's address first, then the other.
    settings = service_settings(tmp_path, allowed_outbound_hosts=("127.0.0.2",), webhook_interval_s=0.0,
                                webhook_timeout_s=DEADLINE_S)
    port = free_port()
    public, internal = Receiver(port=port, host="127.0.0.2").start(), Receiver(port=port, host="127.0.0.1").start()
    answers = ["127.0.0.2"]
    real = socket.getaddrinfo

    def rebinding(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host in ("rebind.test", b"rebind.test"):
            host = answers.pop(0) if len(answers) > 1 else answers[0]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    try:
        with TestClient(create_app(settings)) as app_client:
            _register(app_client, alice, f"http://rebind.test:{port}/hook")
            job_id = _cancelled_job(app_client, alice, settings)
            answers[:] = ["127.0.0.2", "127.0.0.1"]  # one look-up sees the receiver, every later one the service
            dispatch_once(sessions=make_session_factory(engine), settings=settings)
            assert internal.deliveries == []
            assert len(public.deliveries) == 1  # sent to the address that was checked

            # Once the name points inside for good, the connection itself is refused.
            answers[:] = ["127.0.0.1"]
            _cancelled_job(app_client, alice, settings)
            [attempt] = dispatch_once(sessions=make_session_factory(engine), settings=settings)
            assert attempt.outcome == "failed" and internal.deliveries == []
            assert _deliveries(app_client, alice, job_id)[0]["status"] == "delivered"
    finally:
        public.stop()
        internal.stop()
