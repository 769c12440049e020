"""Liveness (``/healthz``) and readiness (``/readyz``) probes; neither needs an API key."""

from __future__ import annotations

from fastapi import APIRouter, Request

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
def readyz(request: Request, session: SessionDep, queue: QueueDep) -> Readiness:
    """The database and the broker answer, and (when this server runs its own workers) one is alive."""
    workers = getattr(request.app.state, "local_workers", None)
    check_ready(session=session, queue=queue, local_workers=workers)
    return Readiness(status="ok", database="ok", broker="ok", workers=None if workers is None else workers.alive())
