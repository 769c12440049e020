"""Webhook endpoints of an API key, its secret for jobs' ``notify_url``, and a job's deliveries."""

from __future__ import annotations

import uuid

from sqlalchemy.orm import Session

from app.api.schemas import DeliveryAttempt, DeliveryPublic, Page, WebhookCreate, WebhookCreated, WebhookPublic
from app.api.services.jobs import get_job
from app.core.db import Webhook, repository
from app.core.errors import InvalidRequestError, ResourceNotFoundError
from app.core.security import check_webhook_url, generate_webhook_secret
from app.core.settings import Settings

#: Endpoints one key may register: each event is sent to each of them.
MAX_WEBHOOKS = 20


def _public(webhook: Webhook) -> WebhookPublic:
    return WebhookPublic(id=webhook.id, url=webhook.url, events=list(webhook.events or []),
                         created_at=webhook.created_at)


def create_webhook(*, session: Session, settings: Settings, owner_id: str, body: WebhookCreate) -> WebhookCreated:
    """Register an endpoint; the answer carries its signing secret, which is not shown again."""
    check_webhook_url(body.url, allowed_hosts=settings.allowed_outbound_hosts, what="the webhook `url`")
    webhook = repository.add_webhook(session, Webhook(id=uuid.uuid4().hex, owner_id=owner_id, url=body.url,
                                                      secret=generate_webhook_secret(),
                                                      events=sorted(set(body.events))), limit=MAX_WEBHOOKS)
    if webhook is None:
        session.rollback()
        raise InvalidRequestError(f"this key already has {MAX_WEBHOOKS} webhooks; delete one first")
    session.commit()
    return WebhookCreated(**_public(webhook).model_dump(), secret=webhook.secret)


def list_webhooks(*, session: Session, owner_id: str) -> Page[WebhookPublic]:
    return Page[WebhookPublic](data=[_public(w) for w in repository.list_webhooks(session, owner_id=owner_id)],
                               next_cursor=None)


def delete_webhook(*, session: Session, owner_id: str, webhook_id: str) -> None:
    if not repository.delete_webhook(session, webhook_id=webhook_id, owner_id=owner_id):
        raise ResourceNotFoundError(f"no webhook {webhook_id!r} for this API key")
    session.commit()


def default_secret(*, session: Session, owner_id: str) -> str:
    """The key's secret for jobs' ``notify_url`` deliveries, made on first use."""
    secret = repository.key_webhook_secret(session, key_id=owner_id)
    if secret is None:
        secret = repository.set_key_webhook_secret(session, key_id=owner_id, secret=generate_webhook_secret())
        session.commit()
    return secret


def list_deliveries(*, session: Session, owner_id: str, job_id: str) -> Page[DeliveryPublic]:
    get_job(session=session, owner_id=owner_id, job_id=job_id)
    found = [
        DeliveryPublic(
            id=delivery.id, webhook_id=event.webhook_id, event=event.type, url=delivery.url,
            endpoint_id=delivery.endpoint_id, status=delivery.status,  # type: ignore[arg-type]
            created_at=delivery.created_at,
            next_attempt_at=delivery.next_attempt_at if delivery.status == "pending" else None,
            delivered_at=delivery.delivered_at,
            # Whether it arrived and the receiver's status only: an error text or a duration would tell a
            # key holder which hosts and ports answer where its URL points (the detail is in the log).
            attempts=[DeliveryAttempt(time=a.attempted_at, delivered=a.status_code is not None
                                      and 200 <= a.status_code < 300, status_code=a.status_code)
                      for a in attempts],
        )
        for delivery, event, attempts in repository.job_deliveries(session, job_id=job_id)
    ]
    return Page[DeliveryPublic](data=found, next_cursor=None)
