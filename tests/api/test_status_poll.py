"""The status poll's own read path (app.api.job_reader) answers exactly what the ORM path answers,
on SQLite (read in the event loop) and PostgreSQL (psycopg's async connections)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.api.job_reader import PostgresReader, SqliteReader
from app.api.main import create_app
from app.core.db import make_session_factory, repository, transaction
from app.core.settings import Settings
from tests.support.helpers import migrated_engine, new_key, postgres_schema_url, service_settings
from tests.support.jobs import finish, start, submit


@pytest.fixture(params=["sqlite", "postgresql"])
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Settings]:
    if request.param == "sqlite":
        yield service_settings(tmp_path)
        return
    with postgres_schema_url() as url:
        yield service_settings(tmp_path, database_url=url)


def test_a_polled_job_reads_the_same_as_the_listed_one(settings: Settings) -> None:
    engine = migrated_engine(settings)
    auth = {"Authorization": f"Bearer {new_key(engine)}"}
    app = create_app(settings)
    assert isinstance(app.state.job_reader, SqliteReader if settings.database_url is None else PostgresReader)
    with TestClient(app) as client:
        job_id = submit(client, auth, settings, labels={"branch": "main"})
        start(engine, job_id)
        finish(engine, job_id)
        for _ in range(7):  # past psycopg's prepare threshold (5): the prepared statement answers too
            polled = client.get(f"/v1/jobs/{job_id}", headers=auth)
            assert polled.status_code == 200 and polled.headers["content-type"] == "application/json"
        listed = client.get("/v1/jobs", headers=auth).json()["data"][0]
        assert polled.json() == listed
        assert polled.json()["finished_at"].endswith("Z") and polled.json()["result"]["k_star"] == 2
        assert client.get("/v1/jobs/nope", headers=auth).status_code == 404
        other = {"Authorization": f"Bearer {new_key(engine, 'bob')}"}
        assert client.get(f"/v1/jobs/{job_id}", headers=other).status_code == 404
    engine.dispose()


def test_a_polled_job_lists_its_attempts_as_the_listed_one_does(settings: Settings) -> None:
    engine = migrated_engine(settings)
    auth = {"Authorization": f"Bearer {new_key(engine)}"}
    with TestClient(create_app(settings)) as client:
        job_id = submit(client, auth, settings)
        assert client.get(f"/v1/jobs/{job_id}", headers=auth).json()["attempts"] == []  # never claimed
        start(engine, job_id, worker="a")
        with transaction(make_session_factory(engine)) as session:  # a worker shutting down gives it back
            assert repository.hand_back_job(session, job_id=job_id, worker_id="a", messages=["stopping"])
        start(engine, job_id, worker="b")
        with transaction(make_session_factory(engine)) as session:
            repository.note_resumed_from(session, job_id=job_id, worker_id="b", resumed_from="selection")
        running = client.get(f"/v1/jobs/{job_id}", headers=auth).json()
        assert [(a["number"], a["worker"], a["end"], a["resumed_from"]) for a in running["attempts"]] == \
            [(1, "a", "handed_back", None), (2, "b", None, "selection")]
        assert running["attempts"][1]["ended_at"] is None
        finish(engine, job_id, worker="b")
        for _ in range(7):  # past psycopg's prepare threshold: the prepared statements answer too
            polled = client.get(f"/v1/jobs/{job_id}", headers=auth).json()
        assert [(a["worker"], a["end"]) for a in polled["attempts"]] == [("a", "handed_back"), ("b", "completed")]
        assert polled["started_at"] == polled["attempts"][0]["started_at"]
        assert polled == client.get("/v1/jobs", headers=auth).json()["data"][0]
    engine.dispose()
