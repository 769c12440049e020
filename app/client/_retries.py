"""When the client tries again, and how long it waits.

A connection error, and a 429, 502, 503 or 504 answer, are worth another try: back-off doubles from
:data:`BACKOFF_FIRST_S` up to :data:`BACKOFF_MAX_S`, with up to 50 % jitter, and is never shorter than
the server's ``Retry-After``. One request is retried by tenacity (:func:`retrying`) until its time is
up; a stream (an event stream, a download) counts how long the server has been away with
:class:`Outage`, which forgets a break as soon as the server answers again.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_delay

from app.client._exceptions import ClientError, ProblemError, TransportError, WaitTimeoutError

#: Answers worth another try: too many requests, and a gateway or server that is briefly away.
RETRY_STATUSES = frozenset({429, 502, 503, 504})
#: Longest ``wait`` goes on trying while the server does not answer (an API restart, a deploy).
OUTAGE_S = 300.0
#: Back-off between tries: first, then doubling up to the cap, each with up to 50 % jitter.
BACKOFF_FIRST_S, BACKOFF_MAX_S = 0.5, 10.0


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` may go away by itself: no answer, or a busy or briefly absent server."""
    if isinstance(exc, ProblemError):
        return exc.status in RETRY_STATUSES
    return isinstance(exc, TransportError)


def backoff_s(tries: int, retry_after: float | None = None) -> float:
    """Seconds to wait after ``tries`` failed tries: doubling from the first, capped, jittered, and
    never less than the server's ``Retry-After``."""
    delay = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** max(0, tries - 1)) * (1 + random.random() / 2)
    return max(delay, retry_after) if retry_after is not None else delay


def _retry_after(exc: BaseException | None) -> float | None:
    return exc.retry_after if isinstance(exc, ProblemError) else None


def retrying(what: str, budget: float | None, on_retry: Callable[[str], None] | None) -> Retrying:
    """Tenacity's loop for one request: transient failures again, until ``budget`` seconds have passed
    (None: until it succeeds). ``on_retry(message)`` hears of each retry."""

    def wait(state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome is not None else None
        delay = backoff_s(state.attempt_number, _retry_after(exc))
        elapsed = state.seconds_since_start or 0.0
        return delay if budget is None else min(delay, max(0.0, budget - elapsed))

    def tell(state: RetryCallState) -> None:
        if on_retry is not None and state.outcome is not None and state.next_action is not None:
            on_retry(f"{what}: {state.outcome.exception()}; trying again in {state.next_action.sleep:.1f} s")

    stop = stop_after_delay(budget) if budget is not None else (lambda _state: False)
    return Retrying(retry=retry_if_exception(is_transient), wait=wait, stop=stop, before_sleep=tell, reraise=True)


class Outage:
    """How long the server has been away during a stream; reset when it answers again.

    ``budget``: the longest one outage may last (None: no limit); ``deadline``: a ``time.monotonic()``
    past which the whole stream gives up with :class:`WaitTimeoutError` (None: none).
    """

    def __init__(self, budget: float | None, deadline: float | None, on_retry: Callable[[str], None] | None,
                 what: str) -> None:
        self._budget, self._deadline, self._on_retry, self._what = budget, deadline, on_retry, what
        self._since: float | None = None
        self._tries = 0

    def ok(self) -> None:
        self._since, self._tries = None, 0

    def failed(self, exc: ClientError) -> None:
        """Sleep before the next try, or raise ``exc`` when it is not transient or time is up."""
        if not is_transient(exc):
            raise exc
        now = time.monotonic()
        self._since = now if self._since is None else self._since
        self._tries += 1
        left = [t for t in (None if self._budget is None else self._since + self._budget - now,
                            None if self._deadline is None else self._deadline - now) if t is not None]
        if left and min(left) <= 0:
            if self._deadline is not None and now >= self._deadline:
                raise WaitTimeoutError(f"{self._what}: gave up at the timeout; last error: {exc}") from exc
            raise exc
        delay = min([backoff_s(self._tries, _retry_after(exc)), *left])
        if self._on_retry is not None:
            self._on_retry(f"{self._what}: {exc}; trying again in {delay:.1f} s")
        time.sleep(delay)
