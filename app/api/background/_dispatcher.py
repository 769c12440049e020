"""The webhook dispatcher: the API's background duty that sends the outbox's deliveries.

It keeps up to ``CAHP_WEBHOOK_MAX_IN_FLIGHT`` deliveries in flight, each in a thread of its pool, and
claims due ones (:mod:`app.core.db.repository._events`) into free slots every ``CAHP_WEBHOOK_INTERVAL_S``
and whenever a send ends, so a slow receiver holds one slot, never the others. No key has more than
``CAHP_WEBHOOK_MAX_IN_FLIGHT_PER_KEY`` of them: the deliveries of a key at its cap are left out of the
claim, so one key's slow receivers cannot take every slot. A claim is a conditional ``UPDATE`` that
pushes the delivery's next attempt past the longest a send can take, so several API processes never
send one at once, and one claimed by a process that died is taken again once its claim runs out.

Each delivery POSTs the event's stored body, signed as Standard Webhooks says (``webhook-id``,
``webhook-timestamp``, ``webhook-signature``; the ``standardwebhooks`` package signs), within
``CAHP_WEBHOOK_TIMEOUT_S`` in all: connecting, sending and reading the status and headers
(:mod:`app.api.background._webhook_http`). A 2xx answer delivers it. Anything else, any exception included, is an
attempt recorded and tried again after an exponential back-off (``CAHP_WEBHOOK_RETRY_INITIAL_S``,
doubling, at most ``CAHP_WEBHOOK_RETRY_MAX_S``, or the receiver's ``Retry-After`` when longer) until
``CAHP_WEBHOOK_RETRY_PERIOD_S`` after the event, when it ends ``failed``. The back-off counts from the
attempt's start plus ``CAHP_WEBHOOK_TIMEOUT_S``, so how a delivery failed (a refused connection, a hung
receiver) never shows in when it is tried again.

At least once: a delivery is recorded as delivered only after the receiver answered, so a crash
between the answer and the record sends it again, with the same ``webhook-id`` for the receiver to
deduplicate.

Every attempt re-checks the URL with the outbound guard (:func:`app.core.security._outbound.check_webhook_url`),
connects only to addresses the guard allows at that moment, and follows no redirect, so neither a DNS
answer that changes nor a receiver's redirect can point the request at an address the guard refuses.
"""

from __future__ import annotations

import datetime as dt
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
from sqlalchemy.orm import Session, sessionmaker
from standardwebhooks.webhooks import Webhook as Signer

from app.api.background._webhook_http import deadline, webhook_client
from app.core.db import repository, transaction, utcnow
from app.core.db.repository import DueDelivery
from app.core.errors import OutboundUrlRefusedError
from app.core.metrics import WEBHOOK_DELIVERIES
from app.core.periodic import Periodic, PeriodicDuty
from app.core.security import check_webhook_url
from app.core.settings import Settings
from app.http_headers import retry_after_s

logger = logging.getLogger(__name__)

USER_AGENT = "cahp-webhooks/1"
#: Deliveries read per claim.
BATCH = 50
#: How long a claim outlives the longest send, for the record to be written.
CLAIM_MARGIN_S = 30.0


@dataclass(frozen=True)
class SendOutcome:
    """What one send learned, as recorded."""

    delivery_id: int
    webhook_id: str
    outcome: str  # "delivered", "retry" or "failed"
    attempted_at: dt.datetime
    duration_ms: float
    status_code: int | None = None
    error: str | None = None
    next_attempt_at: dt.datetime | None = None


def backoff_s(attempts: int, settings: Settings, *, retry_after: float | None = None) -> float:
    """Seconds before the next try after ``attempts`` failed ones: doubling, capped, with 10 % jitter."""
    delay = min(settings.webhook_retry_initial_s * 2 ** max(0, attempts - 1), settings.webhook_retry_max_s)
    if retry_after is not None:
        delay = min(max(delay, retry_after), settings.webhook_retry_max_s)
    return delay * random.uniform(0.9, 1.1)


def _retry_after(response: httpx.Response) -> float | None:
    # Seconds or an HTTP date, read as the command-line client reads it (app.http_headers).
    return retry_after_s(response.headers.get("retry-after"))


def _no_lookup(_host: str) -> list[str]:
    # The addresses are checked as they are connected to (app.api.background._webhook_http), not looked up twice.
    return []


def send(http: httpx.Client, delivery: DueDelivery, secret: str | None, settings: Settings) -> SendOutcome:
    """POST one delivery, signed; says whether it was delivered, is to be retried, or has failed.

    ``http`` must come from :func:`app.api.background._webhook_http.webhook_client`: its backend checks the
    addresses connected to and keeps the deadline. Never raises: whatever goes wrong is the attempt's
    error, so the retry period ends every delivery.
    """
    started = utcnow()
    clock = time.perf_counter()
    status: int | None = None
    error: str | None = None
    retry_after: float | None = None
    outcome = "retry"
    try:
        if secret is None:
            raise OutboundUrlRefusedError("nothing can sign it any more: its endpoint was deleted")
        check_webhook_url(delivery.url, allowed_hosts=settings.allowed_outbound_hosts, what="the webhook URL",
                          resolve=_no_lookup)
        headers = {
            "content-type": "application/json",
            "user-agent": USER_AGENT,
            "webhook-id": delivery.webhook_id,
            "webhook-timestamp": str(int(started.timestamp())),
            "webhook-signature": Signer(secret).sign(delivery.webhook_id, started, delivery.payload),
        }
        # Streamed and closed unread: a receiver's answer body is never needed, however large.
        with deadline(settings.webhook_timeout_s), http.stream(
                "POST", delivery.url, content=delivery.payload.encode(), headers=headers,
                timeout=settings.webhook_timeout_s, follow_redirects=False) as response:
            status = response.status_code
            retry_after = _retry_after(response)
        if 200 <= status < 300:
            outcome = "delivered"
        else:
            error = f"the receiver answered HTTP {status}"
    except OutboundUrlRefusedError as exc:
        outcome, error = "failed", str(exc)[:500]
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"[:500]
    except Exception as exc:  # a URL httpx cannot encode, a bug: still an attempt, or it would wait forever
        logger.exception("webhook %s to %s raised", delivery.webhook_id, delivery.url)
        error = f"{type(exc).__name__}: {exc}"[:500]
    next_at = None
    if outcome == "retry":
        # Counted from the attempt's start plus the longest an attempt may take, never from when it ended:
        # a refused connection and a receiver that hangs to the deadline are retried at the same times, so
        # the schedule a key holder reads says nothing about what answers (or not) at an address.
        wait = settings.webhook_timeout_s + backoff_s(delivery.attempts + 1, settings, retry_after=retry_after)
        next_at = started + dt.timedelta(seconds=wait)
        if next_at > delivery.created_at + dt.timedelta(seconds=settings.webhook_retry_period_s):
            outcome, next_at = "failed", None
    return SendOutcome(delivery_id=delivery.id, webhook_id=delivery.webhook_id, outcome=outcome, attempted_at=started,
                   duration_ms=round((time.perf_counter() - clock) * 1000, 1), status_code=status, error=error,
                   next_attempt_at=next_at)


Claimed = tuple[DueDelivery, str | None]


def claim_due(*, sessions: sessionmaker[Session], settings: Settings, limit: int,
              busy: Mapping[str, int] | None = None) -> list[Claimed]:
    """Claim up to ``limit`` due deliveries, each with the secret that signs it.

    ``busy`` counts the deliveries in flight per key; given, no key is taken past
    ``settings.webhook_max_in_flight_per_key`` and keys already there are left out of the read.
    """
    now = utcnow()
    cap = settings.webhook_max_in_flight_per_key if busy is not None else None
    taken: Counter[str] = Counter(busy or {})
    claimed: list[DueDelivery] = []
    with transaction(sessions) as session:
        full = sorted(key for key, n in taken.items() if cap is not None and n >= cap)
        for delivery in repository.due_deliveries(session, now=now, limit=BATCH, exclude_owners=full):
            if len(claimed) == limit:
                break
            if cap is not None and taken[delivery.owner_id] >= cap:
                continue
            # Held past the longest a send can take; if this process dies meanwhile, it is taken again then.
            if repository.claim_delivery(session, delivery_id=delivery.id, now=now,
                                         hold_s=settings.webhook_timeout_s + CLAIM_MARGIN_S):
                claimed.append(delivery)
                taken[delivery.owner_id] += 1
        if not claimed:
            return []
        by_endpoint, by_key = repository.secrets_for(
            session, endpoint_ids=sorted({d.endpoint_id for d in claimed if d.endpoint_id}),
            owner_ids=sorted({d.owner_id for d in claimed if d.endpoint_id is None}))
    return [(d, by_endpoint.get(d.endpoint_id) if d.endpoint_id else by_key.get(d.owner_id)) for d in claimed]


def deliver(delivery: DueDelivery, secret: str | None, *, sessions: sessionmaker[Session], settings: Settings,
            http: httpx.Client) -> SendOutcome:
    """Send one claimed delivery and record the attempt."""
    attempt = send(http, delivery, secret, settings)
    with transaction(sessions) as session:
        repository.record_attempt(session, delivery_id=delivery.id, attempted_at=attempt.attempted_at,
                                  status_code=attempt.status_code, error=attempt.error,
                                  duration_ms=attempt.duration_ms,
                                  outcome="pending" if attempt.outcome == "retry" else attempt.outcome,
                                  next_attempt_at=attempt.next_attempt_at)
    WEBHOOK_DELIVERIES.labels(attempt.outcome).inc()
    if attempt.outcome != "delivered":
        # The detail is for operators only: callers see whether it arrived and the status code.
        logger.warning("webhook %s to %s: %s after %.0f ms (%s)", delivery.webhook_id, delivery.url, attempt.error,
                       attempt.duration_ms, "will retry" if attempt.outcome == "retry" else "giving up")
    return attempt


def dispatch_once(
    *, sessions: sessionmaker[Session], settings: Settings, http: httpx.Client | None = None
) -> list[SendOutcome]:
    """Send every delivery due now (at most :data:`BATCH`), one after the other; returns the attempts.

    For tests and one-off runs; ``cahp serve`` runs :class:`WebhookDispatcher`.
    """
    claimed = claim_due(sessions=sessions, settings=settings, limit=BATCH)
    if not claimed:
        return []
    client = http if http is not None else webhook_client(allowed_hosts=settings.allowed_outbound_hosts)
    try:
        return [deliver(d, secret, sessions=sessions, settings=settings, http=client) for d, secret in claimed]
    finally:
        if http is None:
            client.close()


class WebhookDispatcher(PeriodicDuty):
    """Keeps deliveries in flight in a thread pool, claiming due ones whenever a slot is free.

    A daemon loop (:class:`app.core.periodic.Periodic`) claims at once and every
    ``settings.webhook_interval_s``; each send that ends claims again, so freed slots are filled
    without waiting for the loop or for the other sends.
    """

    def __init__(self, *, sessions: sessionmaker[Session], settings: Settings) -> None:
        self._sessions, self._settings = sessions, settings
        self._slots = settings.webhook_max_in_flight
        self._http = webhook_client(allowed_hosts=settings.allowed_outbound_hosts)
        self._pool = ThreadPoolExecutor(max_workers=self._slots, thread_name_prefix="cahp-webhook")
        self._in_flight: dict[int, str] = {}  # delivery id -> its key
        self._lock = threading.Lock()          # guards _in_flight and _closed
        self._closed = False
        self._claiming = threading.Lock()      # one claimer at a time
        self._wanted = threading.Event()       # a claim was asked for while another ran
        self._loop = Periodic(self.fill, interval_s=settings.webhook_interval_s, name="cahp-webhooks",
                              immediately=True)

    def stop(self) -> None:
        """Stop claiming and wait for the sends in flight (each ends within its deadline)."""
        super().stop()
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=True)
        self._http.close()

    def fill(self) -> None:
        """Claim due deliveries into the free slots (a call while another claims makes that one go again)."""
        self._wanted.set()
        while self._wanted.is_set() and self._claiming.acquire(blocking=False):
            try:
                self._wanted.clear()
                while self._claim_some():
                    pass
            finally:
                self._claiming.release()

    def _claim_some(self) -> bool:
        with self._lock:
            if self._closed:
                return False
            free = self._slots - len(self._in_flight)
            busy = Counter(self._in_flight.values())
        if free <= 0:
            return False
        claimed = claim_due(sessions=self._sessions, settings=self._settings, limit=free, busy=busy)
        self._start(claimed)
        return bool(claimed)

    def _start(self, claimed: Iterable[Claimed]) -> None:
        with self._lock:
            for delivery, secret in claimed:
                if self._closed:  # stopping: the claim runs out and the delivery is sent again later
                    return
                self._in_flight[delivery.id] = delivery.owner_id
                self._pool.submit(self._send, delivery, secret)

    def _send(self, delivery: DueDelivery, secret: str | None) -> None:
        try:
            deliver(delivery, secret, sessions=self._sessions, settings=self._settings, http=self._http)
        except Exception:
            logger.exception("webhook %s: the attempt could not be recorded; it is sent again when its claim "
                             "runs out", delivery.webhook_id)
        finally:
            with self._lock:
                self._in_flight.pop(delivery.id, None)
        try:
            self.fill()
        except Exception:
            logger.exception("the webhook dispatcher could not claim deliveries; it tries again in %s s",
                             self._settings.webhook_interval_s)
