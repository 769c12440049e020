"""Celery settings that long GPU jobs rely on, and the embedded broker carrying a real message."""

from __future__ import annotations

from pathlib import Path

from kombu import Connection

from app.api.background import JobQueue
from app.core.queue import TASK_NAME, celery_config
from app.core.settings import Settings
from tests.support.helpers import service_settings
from worker.celery_app import make_celery


def test_one_job_per_worker_acknowledged_late(tmp_path: Path) -> None:
    conf = celery_config(service_settings(tmp_path))
    assert conf["worker_prefetch_multiplier"] == 1 and conf["worker_concurrency"] == 1
    assert conf["task_acks_late"] is True and conf["task_reject_on_worker_lost"] is True
    assert conf["task_ignore_result"] is True and conf["accept_content"] == ["json"]


def test_redis_redelivers_only_after_the_longest_allowed_job(tmp_path: Path) -> None:
    settings = service_settings(tmp_path, broker_url="redis://127.0.0.1:6379/0", job_time_limit_s=7200)
    conf = celery_config(settings)
    assert conf["broker_transport_options"] == {"visibility_timeout": 7200 + 3600}
    assert conf["worker_enable_remote_control"] is True
    explicit = service_settings(tmp_path, broker_url="redis://h/1", job_time_limit_s=100,
                                broker_visibility_timeout_s=500)
    assert celery_config(explicit)["broker_transport_options"]["visibility_timeout"] == 500


def test_the_embedded_broker_gets_only_engine_arguments_and_carries_a_message(settings: Settings) -> None:
    conf = celery_config(settings)
    # kombu hands every transport option to sqlalchemy.create_engine, so only engine arguments belong here.
    assert set(conf["broker_transport_options"]) == {"connect_args"}
    assert conf["worker_enable_remote_control"] is False  # the SQL transport has no fanout exchanges
    queue = JobQueue(settings)
    queue.ping()
    queue.enqueue("job-123")
    queue.close()
    with Connection(conf["broker_url"], transport_options=conf["broker_transport_options"]) as connection:
        simple = connection.SimpleQueue(settings.queue)
        message = simple.get(timeout=30)  # already queued: returns at once unless the machine is stalled
        assert message.headers["task"] == TASK_NAME
        assert message.payload[0] == ["job-123"]
        message.ack()
        simple.close()


def test_the_worker_app_registers_the_job_task(settings: Settings) -> None:
    app = make_celery(settings, with_tasks=True)
    task = app.tasks[TASK_NAME]
    assert task.acks_late is True and task.ignore_result is True
    assert app.conf.task_default_queue == settings.queue
