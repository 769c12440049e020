"""The FastAPI application factory."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from app.api.background import JobQueue, Sweeper, WebhookDispatcher
from app.api.console.routes import router as console_router
from app.api.docs_page import router as docs_router
from app.api.job_reader import job_reader
from app.api.metrics import MetricsMiddleware, database_registry
from app.api.metrics import router as metrics_router
from app.api.problems import install_problem_handlers
from app.api.routes import artifacts, health, jobs, uploads, webhooks
from app.api.services.quotas import StreamSlots
from app.core.db import make_engine, make_session_factory, transaction
from app.core.db.repository import ensure_local_principal
from app.core.security import KeyCache
from app.core.settings import Settings, get_settings
from app.core.storage import open_store

API_VERSION = "1.0.0"


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the API for ``settings`` (default: :func:`get_settings`). The schema must be migrated."""
    settings = settings or get_settings()
    engine = make_engine(settings.resolved_database_url)
    sessions = make_session_factory(engine)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.no_auth:
            await run_in_threadpool(_ensure_local_principal)
        # Takes over jobs of lost workers and re-sends lost messages; see app.api.background._sweeper.
        sweeper = None
        if settings.sweep_interval_s > 0:
            sweeper = Sweeper(sessions=sessions, queue=app.state.queue, store=app.state.store,
                              settings=settings).start()
        # Sends webhook deliveries from the outbox; see app.api.background._dispatcher.
        dispatcher = None
        if settings.webhook_interval_s > 0:
            dispatcher = WebhookDispatcher(sessions=sessions, settings=settings).start()
        yield
        app.state.draining.set()
        if dispatcher is not None:
            await run_in_threadpool(dispatcher.stop)
        if sweeper is not None:
            await run_in_threadpool(sweeper.stop)
        await app.state.job_reader.close()
        app.state.queue.close()
        engine.dispose()

    def _ensure_local_principal() -> None:
        with transaction(sessions) as session:
            ensure_local_principal(session)

    app = FastAPI(
        title="cahp",
        version=API_VERSION,
        summary="Complementary Attention Head Pruning as a job service",
        description="Submit a pruning job naming a model and a dataset, poll it, download the pruned "
        "checkpoint, the MSS curve and the head map. Errors are application/problem+json.",
        lifespan=lifespan,
        docs_url=None,  # served by app.api.docs_page from the app's own files
        redoc_url=None,
        openapi_url=None,  # /openapi.json too, with the pages' security headers
    )
    app.state.settings = settings
    app.state.sessions = sessions
    app.state.job_reader = job_reader(settings.resolved_database_url, engine)
    app.state.key_cache = KeyCache(settings.key_cache_s)
    # Set when the server begins to shut down: open event streams end, and their clients reconnect.
    app.state.draining = threading.Event()
    app.state.stream_slots = StreamSlots(settings.max_event_streams_per_key)
    app.state.store = open_store(settings)
    app.state.queue = JobQueue(settings)
    app.state.metrics_registry = database_registry(sessions)
    install_problem_handlers(app)
    app.add_middleware(MetricsMiddleware)
    app.include_router(health.router)
    app.include_router(jobs.router)
    app.include_router(uploads.router)
    app.include_router(artifacts.router)
    app.include_router(webhooks.router)
    app.include_router(metrics_router)
    app.include_router(console_router)
    app.include_router(docs_router)
    return app
