"""What the client raises, in one hierarchy.

The server's errors arrive as ``application/problem+json`` (``app.api.problems``); the client sorts
them by the family of their HTTP status, so a caller can catch "not found" or "the server is in
trouble" without reading status numbers. ``code`` keeps the server's stable code for finer choices.

::

    ClientError                   every error the client raises
    ├── TransportError            no answer: the server is unreachable, a connection broke or timed
    │                             out, an event stream ended early, a resumed download no longer
    │                             fits (tried again until the call's time is up)
    ├── InvalidResponseError      an answer the client cannot read: an undecodable body, a redirect
    │                             loop, JSON that is not the record it should be
    ├── ProblemError              the server answered with an error status (``status``, ``code``,
    │   │                         ``detail``, ``retry_after``)
    │   ├── BadRequestError       400 409 413 415 416 422 and any other 4xx not below: input to
    │   │                         change, or a request the resource's state refuses
    │   ├── AuthError             401 403 a missing, unknown or revoked API key
    │   ├── NotFoundError         404 410 no such job, upload or artifact for this key (or no longer)
    │   ├── RateLimitedError      429 too many requests (tried again after ``Retry-After``)
    │   └── ServerError           5xx the server failed (502 503 504 are tried again; 507: its disk is full)
    ├── ChecksumError             a downloaded artifact whose sha256 differs from the manifest's
    └── WaitTimeoutError          ``wait``/``follow`` gave up at their timeout (also a ``TimeoutError``)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from app.http_headers import retry_after_s

__all__ = [
    "AuthError",
    "BadRequestError",
    "ChecksumError",
    "ClientError",
    "InvalidResponseError",
    "NotFoundError",
    "ProblemError",
    "RateLimitedError",
    "ServerError",
    "TransportError",
    "WaitTimeoutError",
    "httpx_errors",
    "problem_from_response",
]


class ClientError(Exception):
    """Base class of every error the client raises."""


class TransportError(ClientError):
    """No answer came back (the message says why); transient: tried again while the call has time."""


class InvalidResponseError(ClientError):
    """An answer that cannot be read as what was asked for; not tried again."""


class ProblemError(ClientError):
    """The server answered with an error status; the body's ``code`` and ``detail`` say what it was."""

    def __init__(self, status: int, code: str, detail: str, *, retry_after: float | None = None) -> None:
        super().__init__(f"{detail} ({code}, HTTP {status})")
        self.status = status
        self.code = code
        self.detail = detail
        #: Seconds the server asked to wait before trying again (``Retry-After``), if it said.
        self.retry_after = retry_after


class BadRequestError(ProblemError):
    """A 4xx other than the families below: change the request (or the resource's state) first."""


class AuthError(ProblemError):
    """401 or 403: the API key is missing, unknown or revoked."""


class NotFoundError(ProblemError):
    """404 or 410: no such job, upload or artifact for this key, or its artifacts have expired."""


class RateLimitedError(ProblemError):
    """429: too many requests; ``retry_after`` says when to come back."""


class ServerError(ProblemError):
    """5xx: the server (or a gateway before it) failed or is briefly away."""


class ChecksumError(ClientError):
    """A downloaded artifact whose sha256 differs from the manifest's; the partial file is removed."""


class WaitTimeoutError(ClientError, TimeoutError):
    """``wait`` or ``follow`` reached its timeout while the job was still going."""


#: The class of a problem by its status; a status not listed is a ``BadRequestError`` below 500.
_FAMILY: dict[int, type[ProblemError]] = {401: AuthError, 403: AuthError, 404: NotFoundError, 410: NotFoundError,
                                          429: RateLimitedError}


def problem_from_response(response: httpx.Response) -> ProblemError:
    """The :class:`ProblemError` an error answer stands for (its body read; a non-JSON body is the detail)."""
    status = response.status_code
    kind = ServerError if status >= 500 else _FAMILY.get(status, BadRequestError)
    retry_after = retry_after_s(response.headers.get("retry-after"))
    try:
        body = response.json()
    except ValueError:
        return kind(status, "http_error", response.text[:500] or response.reason_phrase, retry_after=retry_after)
    if not isinstance(body, dict):
        return kind(status, "http_error", str(body)[:500], retry_after=retry_after)
    return kind(status, str(body.get("code", "http_error")), str(body.get("detail", body)), retry_after=retry_after)


@contextmanager
def httpx_errors(broke: str, unreadable: str | None = None) -> Iterator[None]:
    """httpx's errors inside as the client's: ``broke: ...`` when no answer came (a :class:`TransportError`),
    ``unreadable: ...`` (default ``broke``) when one came that cannot be read (an :class:`InvalidResponseError`)."""
    try:
        yield
    except httpx.TransportError as exc:
        raise TransportError(f"{broke}: {exc}") from exc
    except httpx.HTTPError as exc:
        raise InvalidResponseError(f"{unreadable or broke}: {exc}") from exc
