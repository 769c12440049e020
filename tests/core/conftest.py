"""The database every persistence test runs on: SQLite and the PostgreSQL server at 127.0.0.1:5432."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from app.core.db import make_engine, make_session_factory, upgrade_database
from tests.support.helpers import postgres_schema_url


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    if request.param == "sqlite":
        engine = make_engine(f"sqlite:///{tmp_path / 'repo.db'}")
        upgrade_database(engine)
        yield engine
        engine.dispose()
        return
    with postgres_schema_url() as url:
        engine = make_engine(url)
        upgrade_database(engine)
        yield engine
        engine.dispose()


@pytest.fixture
def sessions(db: Engine) -> sessionmaker[Session]:
    return make_session_factory(db)
