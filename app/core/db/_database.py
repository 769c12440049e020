"""Database plumbing: the declarative base, engines, sessions and schema migrations.

SQLite (embedded mode) and PostgreSQL (team mode) are both first-class. SQLite gets WAL journaling
and a busy timeout because the API and a worker process write the same file.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import DateTime, Engine, MetaData, create_engine, event, make_url
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker
from sqlalchemy.types import TypeDecorator

# Deterministic constraint names: Alembic's batch mode on SQLite can only drop or alter a
# constraint it can name, and PostgreSQL and SQLite then agree on every name.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

SQLITE_BUSY_TIMEOUT_S = 30


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class UTCDateTime(TypeDecorator[dt.datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite stores them naive)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTCDateTime column; pass an aware one")
        return value.astimezone(dt.UTC)

    def process_result_value(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def make_engine(url: str, *, busy_timeout_s: float = SQLITE_BUSY_TIMEOUT_S, **kwargs: Any) -> Engine:
    """Create an engine; for SQLite, make the directory and set WAL, a busy timeout and foreign keys."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True, **kwargs)
    if parsed.database and parsed.database != ":memory:":
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    connect_args = {"timeout": busy_timeout_s, "check_same_thread": False}
    engine = create_engine(url, connect_args=connect_args, **kwargs)

    @event.listens_for(engine, "connect")
    def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={round(busy_timeout_s * 1000)}")
        cursor.close()

    return engine


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    # expire_on_commit=False: services return rows after committing, and routes read them.
    return sessionmaker(bind=engine, expire_on_commit=False)


@contextmanager
def transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session whose work is committed on success and rolled back on any exception."""
    with factory() as session, session.begin():
        yield session


def migrations_dir() -> Path:
    """Alembic's script directory: ``migrations/`` beside the ``app`` package, in a checkout as in an install.

    Found as a path, never imported: ``migrations/env.py`` imports this module (for the tables'
    metadata), and the arrow runs that way only.
    """
    return Path(__file__).resolve().parents[3] / "migrations"


def upgrade_database(engine: Engine, revision: str = "head") -> None:
    """Apply the Alembic migrations in ``migrations/`` up to ``revision`` (idempotent)."""
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
