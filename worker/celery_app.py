"""The workers' Celery application, configured from the queue contract (:mod:`app.core.queue`).

``cahp worker`` builds it with the job task registered (:func:`worker.tasks.register_tasks`);
``celery -A worker.main`` finds it in :mod:`worker.main`.
"""

from __future__ import annotations

from celery import Celery

from app.core.queue import celery_config, prepare_broker
from app.core.settings import Settings


def make_celery(settings: Settings, *, with_tasks: bool = False) -> Celery:
    """A Celery app for ``settings``; ``with_tasks`` registers the job task (for workers)."""
    prepare_broker(settings)
    app = Celery("cahp", set_as_current=False)
    app.conf.update(celery_config(settings))
    if with_tasks:
        from worker.tasks import register_tasks

        register_tasks(app, settings)
    return app
