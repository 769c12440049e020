"""Which jobs have a message waiting in the broker, read from where the broker keeps its messages.

The sweeper re-sends a ``queued`` job only when no message for it is waiting, so that jobs queued
behind busy workers are not sent again and again. AMQP offers no way to list a queue, but the two
brokers the service supports keep messages where they can be read without taking them:

* Redis (kombu's transport): each queue is a list under the queue's name, plus one list per
  priority step (``<queue>\\x06\\x16<priority>``). Delivered, unacknowledged messages are not in the
  lists; a job whose message is being delivered right now may therefore be sent twice, which is
  harmless (:func:`worker.runner.execute_job` claims a job once).
* The embedded broker (kombu's SQLAlchemy transport): rows of ``kombu_message`` with
  ``visible`` true, joined to ``kombu_queue`` by name.

Both hold kombu's JSON envelope, whose base64 body is Celery's ``[args, kwargs, embed]``.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from sqlalchemy import create_engine, inspect, make_url, text

from app.core.errors import UnavailableError

#: kombu's Redis transport: the separator of priority queue names and its default priority steps.
_REDIS_PRIORITY_SEP = "\x06\x16"
_REDIS_PRIORITY_STEPS = (3, 6, 9)


def waiting_job_ids(broker_url: str, queue: str) -> set[str] | None:
    """Ids of the jobs whose message waits in ``queue``; None for a broker that cannot be read.

    Raises
    ------
    UnavailableError
        When the broker's storage cannot be reached.
    """
    try:
        if broker_url.startswith(("redis://", "rediss://", "redis+socket://")):
            return _redis_waiting(broker_url, queue)
        if broker_url.startswith(("sqla+", "sqlalchemy+")):
            return _sqlalchemy_waiting(broker_url.split("+", 1)[1], queue)
    except UnavailableError:
        raise
    except Exception as exc:
        raise UnavailableError(f"the broker's queue cannot be read: {exc}") from exc
    return None


def _redis_waiting(url: str, queue: str) -> set[str]:
    import redis

    client = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5)
    try:
        keys = [queue, *(f"{queue}{_REDIS_PRIORITY_SEP}{step}" for step in _REDIS_PRIORITY_STEPS)]
        with client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.lrange(key, 0, -1)
            lists = pipe.execute()
    finally:
        client.close()
    return {job for messages in lists for raw in messages if (job := job_id_of(raw)) is not None}


def _sqlalchemy_waiting(url: str, queue: str) -> set[str]:
    engine = create_engine(make_url(url), connect_args={"timeout": 10} if url.startswith("sqlite") else {})
    try:
        with engine.connect() as connection:
            if not inspect(connection).has_table("kombu_message"):
                return set()  # no message was ever sent
            rows = connection.execute(
                text("SELECT m.payload FROM kombu_message m JOIN kombu_queue q ON q.id = m.queue_id "
                     "WHERE q.name = :queue AND m.visible = :visible"),
                {"queue": queue, "visible": True},
            ).scalars()
            return {job for raw in rows if (job := job_id_of(raw)) is not None}
    finally:
        engine.dispose()


def job_id_of(raw: str | bytes) -> str | None:
    """The job id a kombu message envelope carries, or None for anything else."""
    try:
        envelope: Any = json.loads(raw)
        body = envelope["body"]
        if envelope.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, binascii.Error):
        return None
    if isinstance(args, list) and len(args) == 1 and isinstance(args[0], str):
        return args[0]
    return None
