"""Fixtures shared by the whole suite (registered by ``tests/conftest.py``).

A fresh ``settings`` object and a migrated database (``engine``) per test; the app and one ``client``
(a ``TestClient`` over it) that sends ``api_key`` when there is one; keys (``key``, ``alice``) and the
``auth`` header; the first allowed local root; and whether the local Redis answers. A module that needs
other settings, or a client that sends a key, overrides ``settings`` or ``api_key`` in its own scope.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from app.api.main import create_app
from app.core.settings import Settings
from tests.support.helpers import migrated_engine, new_key, service_settings
from tests.support.processes import REDIS_URL


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return service_settings(tmp_path)


@pytest.fixture
def engine(settings: Settings) -> Iterator[Engine]:
    engine = migrated_engine(settings)
    yield engine
    engine.dispose()


@pytest.fixture
def app(settings: Settings, engine: Engine) -> FastAPI:
    return create_app(settings)


@pytest.fixture
def api_key() -> str | None:
    """The key ``client`` sends as a bearer token; none by default (a module overrides this fixture)."""
    return None


@pytest.fixture
def client(app: FastAPI, api_key: str | None) -> Iterator[TestClient]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with TestClient(app, headers=headers) as test_client:
        yield test_client


@pytest.fixture
def key(engine: Engine) -> str:
    return new_key(engine, "alice")


@pytest.fixture
def alice(key: str) -> str:
    """The key of the test's first key holder (the same as ``key``)."""
    return key


@pytest.fixture
def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def local_root(settings: Settings) -> Path:
    return settings.allowed_local_roots[0]


@pytest.fixture(scope="session")
def redis_available() -> str:
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        pytest.skip(f"Redis at {REDIS_URL} is unreachable ({exc}); start it (see .ci/run) to run this")
    return REDIS_URL
