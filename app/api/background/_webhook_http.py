"""The HTTP client webhook deliveries are sent with: httpx, with a network backend of its own.

It makes two promises httpx's own client does not:

- **The address connected to is the address checked.** The backend resolves the receiver's name once,
  checks every answer with the outbound guard (:func:`app.core.security._outbound.check_address`), and connects
  to those addresses only. Checking a URL and then letting the client resolve the name again would
  leave a window in which the DNS answer can change (rebinding) to an address the guard refuses.
- **A delivery ends at its deadline.** httpx's timeouts bound each read and write; a receiver that
  trickles its answer one byte every few seconds never trips one and holds the delivery for hours.
  Inside :func:`deadline`, every connect, read and write (and the TLS handshake, which Python's ssl
  bounds as a whole by the timeout it is given) gets only what is left of the time, and one that
  starts past it fails with a timeout, so connecting, sending and reading the status and headers
  together take at most the deadline. The dispatcher never reads a receiver's answer body.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
import typing
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

import httpcore
import httpx

from app.core.security import check_address

#: Bytes written per call, so a receiver that reads slowly cannot stretch one write past the deadline.
WRITE_CHUNK = 16 * 1024

_local = threading.local()


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Bound everything this thread sends or receives with the client to ``seconds`` from now."""
    _local.deadline = time.monotonic() + seconds
    try:
        yield
    finally:
        _local.deadline = None


def _left(timeout: float | None, error: type[Exception]) -> float | None:
    """The timeout for the next operation: ``timeout``, or less if the deadline is nearer."""
    end: float | None = getattr(_local, "deadline", None)
    if end is None:
        return timeout
    left = end - time.monotonic()
    if left <= 0:
        raise error("the delivery ran past its deadline")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every operation is cut to the calling thread's deadline."""

    def __init__(self, stream: httpcore.NetworkStream) -> None:
        self._stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, _left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        for start in range(0, len(buffer), WRITE_CHUNK):
            self._stream.write(buffer[start:start + WRITE_CHUNK], _left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        return _DeadlineStream(self._stream.start_tls(ssl_context, server_hostname,
                                                      _left(timeout, httpcore.ConnectTimeout)))

    def get_extra_info(self, info: str) -> typing.Any:
        return self._stream.get_extra_info(info)


class GuardedBackend(httpcore.NetworkBackend):
    """Connects only to addresses the outbound guard allows for a webhook receiver, within the deadline."""

    def __init__(self, *, allowed_hosts: Sequence[str]) -> None:
        self._allowed_hosts = tuple(allowed_hosts)
        self._backend = httpcore.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None) -> httpcore.NetworkStream:
        _left(timeout, httpcore.ConnectTimeout)
        try:
            # The lookup itself is not bounded by the deadline: the system resolver takes no timeout.
            answers = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            raise httpcore.ConnectError(f"{host} could not be resolved: {exc}") from exc
        addresses = list(dict.fromkeys(str(answer[4][0]) for answer in answers))
        for address in addresses:  # every answer, as the guard checks a URL: none may be refused
            check_address(host, address, allowed_hosts=self._allowed_hosts)
        failure: Exception = httpcore.ConnectError(f"{host} has no address")
        for address in addresses:
            try:
                stream = self._backend.connect_tcp(address, port, _left(timeout, httpcore.ConnectTimeout),
                                                   local_address, socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc
                continue
            return _DeadlineStream(stream)
        raise failure

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None
                            ) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("webhooks are not sent over Unix sockets")

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def webhook_client(*, allowed_hosts: Sequence[str]) -> httpx.Client:
    """An httpx client that connects through :class:`GuardedBackend`, follows no redirect, and
    ignores proxy variables (the guard has checked the receiver's address, not a proxy's)."""
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=20)  # httpx's defaults
    transport = httpx.HTTPTransport(trust_env=False, limits=limits)
    # httpx has no parameter for httpcore's network backend, so its transport's pool is replaced by
    # one built the same way with the backend; the tests of rebinding fail if this stops taking effect.
    transport._pool = httpcore.ConnectionPool(
        ssl_context=httpx.create_ssl_context(trust_env=False),
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
        network_backend=GuardedBackend(allowed_hosts=allowed_hosts),
    )
    return httpx.Client(transport=transport, trust_env=False, follow_redirects=False)
