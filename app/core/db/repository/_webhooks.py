"""Webhook endpoints of an API key, and the key's own secret for jobs' ``notify_url``."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from app.core.db._models import ApiKey, Webhook, WebhookDelivery


def add_webhook(session: Session, webhook: Webhook, *, limit: int) -> Webhook | None:
    """Add the endpoint unless its key already has ``limit``; None then.

    Race-safe: the key's row is updated first, to itself, which takes its row lock on PostgreSQL and
    the database write lock on SQLite (where ``SELECT ... FOR UPDATE`` does nothing), both held until
    the caller's commit. So two registrations for one key count and insert one after the other.
    """
    session.execute(update(ApiKey).where(ApiKey.id == webhook.owner_id).values(id=ApiKey.id))
    count = session.scalar(select(func.count()).select_from(Webhook).where(Webhook.owner_id == webhook.owner_id))
    if (count or 0) >= limit:
        return None
    session.add(webhook)
    session.flush()
    return webhook


def list_webhooks(session: Session, *, owner_id: str) -> list[Webhook]:
    query = select(Webhook).where(Webhook.owner_id == owner_id).order_by(Webhook.created_at, Webhook.id)
    return list(session.scalars(query))


def get_webhook(session: Session, *, webhook_id: str, owner_id: str | None = None) -> Webhook | None:
    query = select(Webhook).where(Webhook.id == webhook_id)
    if owner_id is not None:
        query = query.where(Webhook.owner_id == owner_id)
    return session.scalar(query)


def delete_webhook(session: Session, *, webhook_id: str, owner_id: str) -> bool:
    """Remove the endpoint; its pending deliveries end ``failed`` (nothing would sign them any more)."""
    webhook = get_webhook(session, webhook_id=webhook_id, owner_id=owner_id)
    if webhook is None:
        return False
    session.execute(update(WebhookDelivery)
                    .where(WebhookDelivery.endpoint_id == webhook_id, WebhookDelivery.status == "pending")
                    .values(status="failed"))
    session.delete(webhook)
    session.flush()
    return True


def webhooks_for(session: Session, *, owner_id: str, event_type: str) -> list[tuple[str, str]]:
    """``(endpoint id, url)`` of the owner's endpoints subscribed to ``event_type``."""
    rows = session.execute(select(Webhook.id, Webhook.url, Webhook.events).where(Webhook.owner_id == owner_id)
                           .order_by(Webhook.created_at, Webhook.id))
    return [(row.id, row.url) for row in rows if not row.events or event_type in row.events]


def key_webhook_secret(session: Session, *, key_id: str) -> str | None:
    return session.scalar(select(ApiKey.webhook_secret).where(ApiKey.id == key_id))


def set_key_webhook_secret(session: Session, *, key_id: str, secret: str) -> str:
    """Store ``secret`` for the key unless it has one; returns the one it has now.

    Conditional, so two first uses at once agree on one secret.
    """
    session.execute(update(ApiKey).where(ApiKey.id == key_id, ApiKey.webhook_secret.is_(None))
                    .values(webhook_secret=secret))
    stored = key_webhook_secret(session, key_id=key_id)
    assert stored is not None
    return stored


def secrets_for(session: Session, *, endpoint_ids: Sequence[str], owner_ids: Sequence[str]
                ) -> tuple[dict[str, str], dict[str, str]]:
    """Signing secrets of the given endpoints, and the webhook secrets of the given keys."""
    endpoints: dict[str, str] = {}
    keys: dict[str, str] = {}
    if endpoint_ids:
        rows = session.execute(select(Webhook.id, Webhook.secret).where(Webhook.id.in_(endpoint_ids))).all()
        endpoints = dict(rows)
    if owner_ids:
        keys = {i: s for i, s in session.execute(select(ApiKey.id, ApiKey.webhook_secret)
                                                 .where(ApiKey.id.in_(owner_ids))) if s}
    return endpoints, keys
