"""The queue contract between the API and the workers, as plain values: no Celery import here.

The API sends one message per job, naming the task :data:`TASK_NAME` with the job id as its only
argument; workers consume :attr:`~app.core.settings.Settings.queue`. Both build their Celery app from
:func:`celery_config`, so the two ends cannot disagree about the broker or the delivery rules.

Choices that follow from jobs being long and running on GPUs:

* ``worker_prefetch_multiplier=1``: a worker reserves one job at a time, so one GPU runs one job and
  a second job waits in the broker for a free worker instead of behind a busy one.
* ``task_acks_late``: the message is acknowledged when the job ends, so a worker that dies mid-job
  leaves it to be delivered again rather than lost. The task is safe to receive twice: it claims
  the job row with a conditional update and does nothing when the job is not ``queued``.
* Redis redelivers a message that is not acknowledged within its ``visibility_timeout``. It is set
  longer than the longest allowed job (``CAHP_BROKER_VISIBILITY_TIMEOUT_S`` >
  ``CAHP_JOB_TIME_LIMIT_S``), so a healthy long job is never handed to a second worker.
* The embedded broker is kombu's SQLAlchemy transport on SQLite. That transport passes every
  ``broker_transport_options`` entry to ``sqlalchemy.create_engine``, so it gets only engine
  arguments; it has no fanout exchanges, so remote control (which needs them) is off there.
"""

from __future__ import annotations

from typing import Any

from app.core.db import SQLITE_BUSY_TIMEOUT_S
from app.core.settings import Settings

TASK_NAME = "cahp.run_job"


def celery_config(settings: Settings) -> dict[str, Any]:
    """The Celery configuration for ``settings`` (a plain dict, so tests can read it)."""
    broker = settings.resolved_broker_url
    embedded = broker.startswith(("sqla+", "sqlalchemy+"))
    if embedded:
        transport_options: dict[str, Any] = {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S}}
    elif broker.startswith(("redis://", "rediss://", "redis+socket://")):
        transport_options = {"visibility_timeout": settings.visibility_timeout_s}
    else:
        transport_options = {}
    return {
        "broker_url": broker,
        "broker_transport_options": transport_options,
        "broker_connection_retry_on_startup": True,
        "broker_connection_timeout": 5,
        "task_default_queue": settings.queue,
        "task_acks_late": True,
        # A worker process killed mid-job returns its message to the queue instead of dropping it.
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        # A running job survives a broker restart: its lease in the database says who holds it, so
        # there is no reason to kill it when the connection to the broker drops.
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        "worker_concurrency": 1,
        "task_ignore_result": True,
        "result_backend": None,
        "task_serializer": "json",
        "accept_content": ["json"],
        # Submissions must not hang when the broker is down: a few quick retries, then an error.
        "task_publish_retry": True,
        "task_publish_retry_policy": {"max_retries": 2, "interval_start": 0, "interval_step": 0.5,
                                      "interval_max": 1},
        "worker_enable_remote_control": not embedded,
        "worker_send_task_events": False,
        "worker_hijack_root_logger": False,
    }


def prepare_broker(settings: Settings) -> None:
    """Create what the embedded broker needs before a Celery app connects (SQLite makes the file only)."""
    if settings.embedded_broker:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
