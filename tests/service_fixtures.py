"""Fixtures shared by the service tests (api, worker, reliability): a fresh settings object and a
migrated database per test. Registered for the whole suite by ``tests/conftest.py``; a module that needs
other settings defines its own ``settings`` fixture, which takes precedence."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from app.core.settings import Settings
from tests.api.helpers import migrated_engine, service_settings


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return service_settings(tmp_path)


@pytest.fixture
def engine(settings: Settings) -> Iterator[Engine]:
    engine = migrated_engine(settings)
    yield engine
    engine.dispose()
