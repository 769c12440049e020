"""Worker tests call the task's logic (execute_job) directly, on a fresh database and store per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from app.api.main import create_app
from app.core.db import make_session_factory
from app.core.settings import Settings
from app.core.storage import open_store
from tests.api.helpers import new_key, write_tiny_dataset, write_tiny_model
from worker.runner import WorkerContext


@pytest.fixture
def sessions(engine: Engine) -> sessionmaker[Session]:
    return make_session_factory(engine)


@pytest.fixture
def context(settings: Settings, sessions: sessionmaker[Session]) -> WorkerContext:
    return WorkerContext(settings=settings, sessions=sessions, store=open_store(settings), worker_id="test-worker")


@pytest.fixture
def client(settings: Settings, engine: Engine) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as test_client:
        yield test_client


@pytest.fixture
def auth(engine: Engine) -> dict[str, str]:
    return {"Authorization": f"Bearer {new_key(engine)}"}


@pytest.fixture
def local_root(settings: Settings) -> Path:
    return settings.allowed_local_roots[0]


@pytest.fixture
def model_uri(local_root: Path) -> str:
    return f"file://{write_tiny_model(local_root / 'model')}"


@pytest.fixture
def dataset_uri(local_root: Path) -> str:
    return f"file://{write_tiny_dataset(local_root / 'data')}"
