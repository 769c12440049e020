"""The Celery task: a thin shell around :func:`worker.runner.execute_job`.

The message carries only the job id. Everything the task needs is re-read from the job row, so a
redelivered or duplicated message is harmless (see :func:`execute_job`), and a job's definition
cannot differ between the database and the queue.
"""

from __future__ import annotations

from functools import lru_cache

from celery import Celery
from celery.signals import worker_process_init

from app.core.db import make_engine, make_session_factory
from app.core.queue import TASK_NAME
from app.core.settings import Settings
from app.core.storage import open_store
from worker.lifecycle import watch_parent
from worker.runner import WorkerContext, execute_job, new_worker_id


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

    @app.task(name=TASK_NAME, acks_late=True, ignore_result=True)
    def run_job(job_id: str) -> str:
        return execute_job(job_id=job_id, context=worker_context(settings)).value
