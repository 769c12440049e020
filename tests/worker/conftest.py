"""Worker tests call the task's logic (execute_job) directly, on a fresh database and store per test."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from app.core.db import make_session_factory
from app.core.settings import Settings
from app.core.storage import open_store
from tests.support.helpers import write_tiny_dataset, write_tiny_model
from worker.runner import WorkerContext


@pytest.fixture
def sessions(engine: Engine) -> sessionmaker[Session]:
    return make_session_factory(engine)


@pytest.fixture
def context(settings: Settings, sessions: sessionmaker[Session]) -> WorkerContext:
    return WorkerContext(settings=settings, sessions=sessions, store=open_store(settings), worker_id="test-worker")


@pytest.fixture
def model_uri(local_root: Path) -> str:
    return f"file://{write_tiny_model(local_root / 'model')}"


@pytest.fixture
def dataset_uri(local_root: Path) -> str:
    return f"file://{write_tiny_dataset(local_root / 'data')}"
