"""Concurrent submissions against a real ``cahp serve``, on SQLite and on the PostgreSQL server at
127.0.0.1:5432 (in a schema of its own): 50 requests with one Idempotency-Key create exactly one
job, and 100 distinct submissions at once are all accepted, each recorded and sent once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text

from app.api.background import job_id_of
from app.core.settings import Settings
from tests.support.helpers import job_body, migrated_engine, new_key, postgres_schema_url, service_settings
from tests.support.processes import stop
from tests.support.stack import start_server


@contextmanager
def _database(kind: str, tmp_path: Path) -> Iterator[Settings]:
    # The submits here are one key's, more than its default quota of active jobs allows.
    if kind == "sqlite":
        yield service_settings(tmp_path, max_active_jobs_per_key=10_000)
        return
    with postgres_schema_url() as url:
        yield service_settings(tmp_path, database_url=url, max_active_jobs_per_key=10_000)


def _at_once(count: int, send: Callable[[httpx.Client, int], httpx.Response], url: str, key: str
             ) -> list[httpx.Response]:
    """``count`` threads, each with its own connection, released together by a barrier."""
    answers: list[httpx.Response] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(count)

    def client(i: int) -> None:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120) as http:
            barrier.wait()
            try:
                answers.append(send(http, i))
            except httpx.HTTPError as exc:
                errors.append(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and len(answers) == count
    return answers


def _messages(settings: Settings) -> list[str | None]:
    broker = create_engine(f"sqlite:///{settings.data_dir / 'broker.db'}")
    try:
        with broker.connect() as connection:
            return [job_id_of(p) for p in connection.execute(text("SELECT payload FROM kombu_message")).scalars()]
    finally:
        broker.dispose()


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_concurrent_submissions_create_exactly_the_jobs_asked_for(kind: str, tmp_path: Path) -> None:
    with _database(kind, tmp_path) as settings:
        engine = migrated_engine(settings)
        key = new_key(engine, "ci")
        body = job_body("hf://org/model", "hf://datasets/org/data")
        server = start_server(settings, tmp_path / "api.log")
        try:
            same = _at_once(50, lambda http, i: http.post("/v1/jobs", json=body,
                                                          headers={"Idempotency-Key": "pipeline-4711"}),
                            server.url, key)
            distinct = _at_once(100, lambda http, i: http.post("/v1/jobs", json=body,
                                                               headers={"Idempotency-Key": f"build-{i}"}),
                                server.url, key)
        finally:
            stop(server.process)
        # One key, 50 requests: one job, the 49 others replayed it.
        assert sorted({a.status_code for a in same}) == [202], [a.text for a in same if a.status_code != 202]
        [only] = {a.json()["id"] for a in same}
        assert sum(a.headers.get("idempotent-replayed") == "true" for a in same) == 49
        # 100 keys at once: 100 jobs, none lost, none twice (no request waited on a starved pool).
        assert sorted({a.status_code for a in distinct}) == [202], [a.text[:200] for a in distinct
                                                                      if a.status_code != 202][:3]
        created = {a.json()["id"] for a in distinct}
        assert len(created) == 100 and only not in created
        with engine.connect() as connection:
            rows = set(connection.execute(text("SELECT id FROM jobs")).scalars())
        engine.dispose()
        assert rows == created | {only}
        messages = _messages(settings)
        assert sorted(messages) == sorted(rows)  # each job sent to the broker once
