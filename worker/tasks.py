"""The Celery tasks: thin shells around :func:`worker.runner.execute_job` and, for an accuracy budget's
pieces, :func:`worker.candidates.run_piece`.

The message carries only the job id. Everything the task needs is re-read from the job row, so a
redelivered or duplicated message is harmless (see :func:`execute_job`), and a job's definition
cannot differ between the database and the queue. A job handed back by a worker that is shutting
down (:mod:`worker.shutdown`) is sent again at once, for another worker to resume; a stopping worker
that receives a job's message never claims it, it sends it on.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from functools import lru_cache

from celery import Celery
from celery.signals import worker_init, worker_process_init, worker_shutting_down

from app.core.db import make_engine, make_session_factory, repository, transaction
from app.core.queue import TASK_NAME
from app.core.settings import Settings
from app.core.storage import open_store
from worker import shutdown
from worker.candidates import PIECE_TASK_NAME, forget_inputs, run_piece
from worker.lifecycle import watch_parent
from worker.runner import Outcome, WorkerContext, execute_job, new_worker_id

logger = logging.getLogger(__name__)


def _watch_worker_main(**_kwargs: object) -> None:
    watch_parent()


@lru_cache(maxsize=4)
def worker_context(settings: Settings) -> WorkerContext:
    # Built on first use inside the process that runs jobs (after a prefork fork), never inherited.
    engine = make_engine(settings.resolved_database_url)
    return WorkerContext(settings=settings, sessions=make_session_factory(engine), store=open_store(settings),
                         worker_id=new_worker_id())


def register_tasks(app: Celery, settings: Settings) -> None:
    """Register the job task on ``app``; it runs jobs with ``settings``.

    Pool processes also get a watchdog, so none outlives the worker's main process (a ``kill -9``
    of the worker would otherwise leave its pool children running jobs nobody holds a lease for).
    """
    worker_process_init.connect(_watch_worker_main, weak=False)
    work_dir = settings.resolved_work_dir

    def started(**_kwargs: object) -> None:
        shutdown.clear(work_dir)

    def stopping(**_kwargs: object) -> None:
        # The main process, at SIGTERM (or SIGINT): the job under way hands itself back (worker.shutdown).
        shutdown.request(work_dir)

    worker_init.connect(started, weak=False)
    worker_shutting_down.connect(stopping, weak=False)

    def send_piece(piece_id: str) -> None:
        app.send_task(PIECE_TASK_NAME, args=[piece_id], queue=settings.queue)

    # The embedded mode's one worker runs a budget's candidates in turn; a pool shares them out.
    pool = None if settings.embedded_broker else send_piece

    @app.task(name=TASK_NAME, acks_late=True, ignore_result=True)
    def run_job(job_id: str) -> str:
        if shutdown.requested(work_dir):
            # A stopping worker can still be handed a message (the one its own hand-back sent, among
            # others): it never claims, it sends the message on for a worker that is not stopping.
            logger.warning("job %s: this worker is shutting down; its message is sent on, unclaimed", job_id)
            requeue(app, worker_context(settings), job_id)
            return "declined"
        forget_inputs()  # the memory a budget's pieces held goes to the job
        context = dataclasses.replace(worker_context(settings), send_piece=pool)
        outcome = execute_job(job_id=job_id, context=context)
        if outcome is Outcome.handed_back:
            requeue(app, context, job_id)
        return outcome.value

    _register_piece_task(app, settings, pool)


def _register_piece_task(app: Celery, settings: Settings, pool: Callable[[str], None] | None) -> None:
    @app.task(name=PIECE_TASK_NAME, acks_late=True, ignore_result=True)
    def run_budget_piece(piece_id: str) -> str:
        context = worker_context(settings)
        # Another key's job owed a turn goes first; the piece stays queued and its search's worker runs it.
        with transaction(context.sessions) as session:
            owed = repository.job_owed_before_piece(session, piece_id=piece_id, max_attempts=settings.max_attempts)
        if owed is not None:
            forget_inputs()
            job_context = dataclasses.replace(context, send_piece=pool)
            outcome = execute_job(job_id=owed, context=job_context)
            if outcome is Outcome.handed_back:
                requeue(app, job_context, owed)
            return outcome.value
        # Claimed from the database like a job: a duplicated or stale message does nothing.
        return run_piece(piece_id, context)


def requeue(app: Celery, context: WorkerContext, job_id: str) -> None:
    """Send a handed-back job's message now, for another worker; if that fails the sweeper sends it."""
    try:
        app.send_task(TASK_NAME, args=[job_id], queue=context.settings.queue)
    except Exception as exc:
        logger.warning("job %s was handed back but its message could not be sent (%s); the sweeper sends it",
                       job_id, exc)
        with transaction(context.sessions) as session:
            repository.mark_not_enqueued(session, job_id=job_id)
