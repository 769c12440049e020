"""The webhook dispatcher: the API's background duty that sends the outbox's deliveries.

Every ``CAHP_WEBHOOK_INTERVAL_S`` it takes the deliveries that are due (:mod:`app.core.repository.events`),
claims each with a conditional ``UPDATE`` (so several API processes never send one at once), and
POSTs the event's stored body to the URL, signed as Standard Webhooks says (``webhook-id``,
``webhook-timestamp``, ``webhook-signature``; the ``standardwebhooks`` package signs). A 2xx answer
delivers it. Anything else is tried again after an exponential back-off (``CAHP_WEBHOOK_RETRY_INITIAL_S``,
doubling, at most ``CAHP_WEBHOOK_RETRY_MAX_S``, or the receiver's ``Retry-After`` when longer) until
``CAHP_WEBHOOK_RETRY_PERIOD_S`` after the event, when it ends ``failed``.

At least once: a delivery is recorded as delivered only after the receiver answered, so a crash
between the answer and the record sends it again, with the same ``webhook-id`` for the receiver to
deduplicate. A delivery claimed by a process that died is taken again once its claim expires.

Every attempt re-checks the URL with the outbound guard (:func:`app.core.outbound.check_webhook_url`)
and follows no redirect, so a receiver cannot bounce the request to an address the guard refuses.
"""

from __future__ import annotations

import datetime as dt
import logging
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
from sqlalchemy.orm import Session, sessionmaker
from standardwebhooks.webhooks import Webhook as Signer

from app.client import retry_after_s
from app.core import repository
from app.core.db import transaction, utcnow
from app.core.errors import OutboundUrlRefusedError
from app.core.metrics import WEBHOOK_DELIVERIES
from app.core.outbound import check_webhook_url
from app.core.periodic import Periodic
from app.core.repository import DueDelivery
from app.core.settings import Settings

logger = logging.getLogger(__name__)

USER_AGENT = "cahp-webhooks/1"
#: Deliveries sent at once; one slow receiver does not hold up the others.
CONCURRENCY = 4
#: Deliveries taken per tick.
BATCH = 50


@dataclass(frozen=True)
class Attempt:
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
    # Seconds or an HTTP date, read as the command-line client reads it.
    return retry_after_s(response.headers.get("retry-after"))


def send(http: httpx.Client, delivery: DueDelivery, secret: str | None, settings: Settings) -> Attempt:
    """POST one delivery, signed; says whether it was delivered, is to be retried, or has failed."""
    started = utcnow()
    clock = time.perf_counter()
    status: int | None = None
    error: str | None = None
    retry_after: float | None = None
    outcome = "retry"
    try:
        if secret is None:
            raise OutboundUrlRefusedError("nothing can sign it any more: its endpoint was deleted")
        check_webhook_url(delivery.url, allowed_hosts=settings.allowed_outbound_hosts, what="the webhook URL")
        headers = {
            "content-type": "application/json",
            "user-agent": USER_AGENT,
            "webhook-id": delivery.webhook_id,
            "webhook-timestamp": str(int(started.timestamp())),
            "webhook-signature": Signer(secret).sign(delivery.webhook_id, started, delivery.payload),
        }
        # Streamed and closed unread: a receiver's answer body is never needed, however large.
        with http.stream("POST", delivery.url, content=delivery.payload.encode(), headers=headers,
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
    next_at = None
    if outcome == "retry":
        next_at = utcnow() + dt.timedelta(seconds=backoff_s(delivery.attempts + 1, settings, retry_after=retry_after))
        if next_at > delivery.created_at + dt.timedelta(seconds=settings.webhook_retry_period_s):
            outcome, next_at = "failed", None
    return Attempt(delivery_id=delivery.id, webhook_id=delivery.webhook_id, outcome=outcome, attempted_at=started,
                   duration_ms=round((time.perf_counter() - clock) * 1000, 1), status_code=status, error=error,
                   next_attempt_at=next_at)


def dispatch_once(
    *, sessions: sessionmaker[Session], settings: Settings, http: httpx.Client, pool: ThreadPoolExecutor | None = None
) -> list[Attempt]:
    """Send every delivery due now (at most :data:`BATCH`); returns the attempts made."""
    now = utcnow()
    with transaction(sessions) as session:
        due = repository.due_deliveries(session, now=now, limit=BATCH)
        if not due:
            return []
        by_endpoint, by_key = repository.secrets_for(
            session, endpoint_ids=sorted({d.endpoint_id for d in due if d.endpoint_id}),
            owner_ids=sorted({d.owner_id for d in due if d.endpoint_id is None}))

    def one(delivery: DueDelivery) -> Attempt | None:
        with transaction(sessions) as session:
            # Held past the longest a send can take; if this process dies meanwhile, it is taken again then.
            if not repository.claim_delivery(session, delivery_id=delivery.id, now=now,
                                             hold_s=settings.webhook_timeout_s + 30):
                return None
        secret = by_endpoint.get(delivery.endpoint_id) if delivery.endpoint_id else by_key.get(delivery.owner_id)
        attempt = send(http, delivery, secret, settings)
        with transaction(sessions) as session:
            repository.record_attempt(session, delivery_id=delivery.id, attempted_at=attempt.attempted_at,
                                      status_code=attempt.status_code, error=attempt.error,
                                      duration_ms=attempt.duration_ms,
                                      outcome="pending" if attempt.outcome == "retry" else attempt.outcome,
                                      next_attempt_at=attempt.next_attempt_at)
        WEBHOOK_DELIVERIES.labels(attempt.outcome).inc()
        if attempt.outcome != "delivered":
            logger.warning("webhook %s to %s: %s (%s)", delivery.webhook_id, delivery.url, attempt.error,
                           "will retry" if attempt.outcome == "retry" else "giving up")
        return attempt

    results = list(pool.map(one, due)) if pool is not None else [one(d) for d in due]
    return [r for r in results if r is not None]


class WebhookDispatcher:
    """Runs :func:`dispatch_once` in a daemon thread: at once, then every ``settings.webhook_interval_s``."""

    def __init__(self, *, sessions: sessionmaker[Session], settings: Settings) -> None:
        self._sessions, self._settings = sessions, settings
        # No proxies from the environment: the outbound guard has checked this URL, not a proxy's.
        self._http = httpx.Client(trust_env=False, follow_redirects=False)
        self._pool = ThreadPoolExecutor(max_workers=CONCURRENCY, thread_name_prefix="cahp-webhook")
        self._loop = Periodic(self._tick, interval_s=settings.webhook_interval_s, name="cahp-webhooks",
                              immediately=True)

    def start(self) -> WebhookDispatcher:
        self._loop.start()
        return self

    def stop(self) -> None:
        self._loop.stop()
        self._pool.shutdown(wait=True)
        self._http.close()

    def _tick(self) -> None:
        dispatch_once(sessions=self._sessions, settings=self._settings, http=self._http, pool=self._pool)
