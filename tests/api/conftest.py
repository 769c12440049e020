"""Each API test gets its own SQLite database, embedded broker and artifact directory under tmp_path."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from app.api.main import create_app
from app.core.settings import Settings
from tests.api.helpers import new_key


@pytest.fixture
def app(settings: Settings, engine: Engine) -> FastAPI:
    return create_app(settings)


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app) as test_client:
        yield test_client


@pytest.fixture
def key(engine: Engine) -> str:
    return new_key(engine, "alice")


@pytest.fixture
def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def local_root(settings: Settings) -> Path:
    return settings.allowed_local_roots[0]
