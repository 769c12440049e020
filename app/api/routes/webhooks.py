"""``/v1/webhooks``: endpoints that receive the events of this key's jobs (Standard Webhooks)."""

from __future__ import annotations

from fastapi import APIRouter, Response

from app.api.deps import ApiKeyDep, SessionDep, SettingsDep
from app.api.routes.problem_docs import problem_responses
from app.api.schemas import Page, WebhookCreate, WebhookCreated, WebhookPublic, WebhookSecret
from app.api.services import webhooks

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"])


@router.post("", status_code=201, responses=problem_responses(400, 401, 422))
def create_webhook(body: WebhookCreate, session: SessionDep, settings: SettingsDep, key: ApiKeyDep) -> WebhookCreated:
    """Register an endpoint for this key's job events; ``secret`` is in this answer only."""
    return webhooks.create_webhook(session=session, settings=settings, owner_id=key.id, body=body)


@router.get("", responses=problem_responses(401))
def list_webhooks(session: SessionDep, key: ApiKeyDep) -> Page[WebhookPublic]:
    """This key's endpoints (without their secrets)."""
    return webhooks.list_webhooks(session=session, owner_id=key.id)


@router.get("/default/secret", responses=problem_responses(401))
def default_secret(session: SessionDep, key: ApiKeyDep) -> WebhookSecret:
    """The secret that signs deliveries to jobs' own ``notify_url`` (made on first use)."""
    return WebhookSecret(secret=webhooks.default_secret(session=session, owner_id=key.id))


@router.delete("/{webhook_id}", status_code=204, responses=problem_responses(401, 404))
def delete_webhook(webhook_id: str, session: SessionDep, key: ApiKeyDep) -> Response:
    """Remove an endpoint; deliveries to it that are still pending end ``failed``."""
    webhooks.delete_webhook(session=session, owner_id=key.id, webhook_id=webhook_id)
    return Response(status_code=204)
