"""The API's end of the queue: sending job ids to the workers through the Celery broker.

The task is sent by name (:data:`app.core.queue.TASK_NAME`), so the API never imports the worker
or the engine; both ends take their Celery settings from :func:`app.core.queue.celery_config`.
"""

from __future__ import annotations

import logging

from celery import Celery

from app.api.background._broker_probe import waiting_job_ids
from app.core.errors import UnavailableError
from app.core.queue import TASK_NAME, celery_config, prepare_broker
from app.core.settings import Settings

logger = logging.getLogger(__name__)


class JobQueue:
    """The broker as the API sees it: a place to send job ids, and something to ping."""

    def __init__(self, settings: Settings) -> None:
        self.queue = settings.queue
        self._broker_url = settings.resolved_broker_url
        prepare_broker(settings)
        self._celery = Celery("cahp-api", set_as_current=False)
        self._celery.conf.update(celery_config(settings))

    def enqueue(self, job_id: str) -> None:
        """Send ``job_id`` to the workers; UnavailableError when the broker cannot be reached."""
        try:
            self._celery.send_task(TASK_NAME, args=[job_id], queue=self.queue)
        except Exception as exc:  # kombu raises transport-specific errors
            logger.warning("could not enqueue job %s: %s", job_id, exc)
            raise UnavailableError("the job queue cannot be reached; the job stays queued and is sent later") from exc

    def waiting_job_ids(self) -> set[str] | None:
        """Ids of jobs with a message waiting in the queue (None: this broker cannot be listed)."""
        return waiting_job_ids(self._broker_url, self.queue)

    def ping(self) -> None:
        """Raise UnavailableError unless the broker accepts a connection."""
        try:
            with self._celery.connection_for_write() as connection:
                connection.ensure_connection(max_retries=1, timeout=3)
                # Declaring the job queue (as the workers do) is a round trip on every transport, and on
                # the embedded broker it proves the SQLite file can be written.
                connection.default_channel.queue_declare(queue=self.queue, durable=True, auto_delete=False)
        except Exception as exc:
            raise UnavailableError(f"the broker cannot be reached: {exc}") from exc

    def close(self) -> None:
        self._celery.close()
