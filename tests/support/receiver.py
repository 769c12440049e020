"""A real HTTP server on loopback for the service to call: a webhook receiver, or a cutting proxy.

:class:`Receiver` records every POST (headers and exact body) and answers with the status a test
sets; it can be stopped and started again on the same port (a receiver that is down, then back).
:class:`CuttingProxy` forwards connections to the API and, for the first response whose request
matches, closes the connection after a number of bytes: a download that breaks off for real.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.support.helpers import free_port


@dataclass
class Delivery:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    """``http://127.0.0.1:<port>/hook``: records deliveries, answers ``status`` (200 by default).

    ``host`` may be another loopback address (``127.0.0.2``...), e.g. to tell two receivers apart on one port.
    """

    port: int = field(default_factory=free_port)
    host: str = "127.0.0.1"
    status: int = 200
    deliveries: list[Delivery] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/hook"

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server naming
                length = int(self.headers.get("content-length", "0"))
                body = self.rfile.read(length)
                receiver.deliveries.append(Delivery(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(receiver.status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer((self.host, self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def of_type(self, event_type: str) -> list[Delivery]:
        import json

        return [d for d in self.deliveries if json.loads(d.body)["type"] == event_type]

    def wait_for(self, event_type: str, *, timeout: float = 60.0) -> Delivery:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.of_type(event_type)
            if found:
                return found[0]
            time.sleep(0.05)
        raise AssertionError(f"no {event_type} delivery within {timeout} s; got {[d.body for d in self.deliveries]}")


class CuttingProxy:
    """Forwards TCP to ``127.0.0.1:target``; the first response to a request containing ``cut_marker``
    is cut after ``cut_after`` bytes. ``requests`` keeps the head of every request it forwarded."""

    def __init__(self, target: int, *, cut_marker: bytes, cut_after: int) -> None:
        self.target = target
        self.port = free_port()
        self.cut_marker = cut_marker
        self.cut_after = cut_after
        self.requests: list[bytes] = []
        self.cuts = 0
        self._listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.target))
        armed = threading.Event()

        def up() -> None:  # client -> API; arms the cut when the marked request goes by
            try:
                while data := client.recv(65536):
                    self.requests.append(data)
                    if self.cuts == 0 and self.cut_marker in data:
                        self.cuts += 1
                        armed.set()
                    upstream.sendall(data)
            except OSError:
                pass
            finally:
                _close(upstream)

        threading.Thread(target=up, daemon=True).start()
        sent = 0
        try:  # API -> client; once armed, only cut_after more bytes, then both ends are closed
            while data := upstream.recv(65536):
                if armed.is_set():
                    data = data[: self.cut_after - sent]
                    sent += len(data)
                client.sendall(data)
                if armed.is_set() and sent >= self.cut_after:
                    break
        except OSError:
            pass
        finally:
            _close(client)
            _close(upstream)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
