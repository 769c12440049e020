"""The status poll's own read path (app.api.job_reader) answers exactly what the ORM path answers,
on SQLite (read in the event loop) and PostgreSQL (psycopg's async connections)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.api.job_reader import PostgresReader, SqliteReader
from app.api.main import create_app
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
