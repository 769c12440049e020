"""Liveness (``/healthz``) and readiness (``/readyz``) probes; neither needs an API key."""

from __future__ import annotations

from fastapi import APIRouter

from app.api.deps import QueueDep, SessionDep
from app.api.routes.problem_docs import problem_responses
from app.api.schemas import Health, Readiness
from app.api.services.health import check_ready

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> Health:
    """The process is up."""
    return Health(status="ok")


@router.get("/readyz", responses=problem_responses(503))
def readyz(session: SessionDep, queue: QueueDep) -> Readiness:
    """The database and the broker answer."""
    check_ready(session=session, queue=queue)
    return Readiness(status="ok", database="ok", broker="ok")
