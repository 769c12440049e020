"""Alembic environment: runs the migrations against the service's database.

``cahp db upgrade`` and ``cahp serve`` pass an open connection in ``config.attributes``; a plain
``alembic upgrade head`` (with alembic.ini) builds one from the ``CAHP_*`` settings.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, text

from app.core.db import (
    Base,
    Job,  # noqa: F401 - loads the tables' module, which registers every table on Base.metadata
    make_engine,
)

# An arbitrary constant: the PostgreSQL advisory lock that serialises concurrent upgrades (several
# API replicas starting at once).
_PG_LOCK_ID = 0x43414850


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        # SQLite cannot ALTER most things; batch mode copies the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": _PG_LOCK_ID})
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = context.config.get_main_option("sqlalchemy.url")
    if not url:
        from app.core.settings import get_settings

        url = get_settings().resolved_database_url
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            _run(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; run `cahp db upgrade` against a database")
run_migrations_online()
