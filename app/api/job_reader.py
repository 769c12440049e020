"""Reading a job for a status poll without a turn in the thread pool.

Profiling the poll (docs/performance.md) showed that handing the read to a worker thread and back
cost several times the read itself once 50 clients poll at once: each hand-off wakes a thread,
and the threads then fight the event loop for the GIL. So the status route reads in the event loop:

- **SQLite** through one connection of the reader's own. In WAL mode a reader never waits for a
  writer, and reading one row by its key is a few tens of microseconds from the page cache. The
  connection's busy timeout is 20 ms, not 30 s: should the file be busy anyway (WAL recovery after a
  crash), the read goes to the thread pool and the loop is held for at most that long.
- **PostgreSQL** through an asyncio engine (psycopg's async mode): the query's round trip is
  awaited, not waited for. One pool per event loop (connections belong to the loop that made them).
- Any other driver: the thread pool, as every other route.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from sqlalchemy import Engine, Row, make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import StaticPool
from starlette.concurrency import run_in_threadpool

from app.core import repository
from app.core.db import make_engine

#: Longest a SQLite read may hold the event loop before it is handed to the thread pool.
SQLITE_LOOP_TIMEOUT_S = 0.02


class JobReader(Protocol):
    async def job_row(self, *, job_id: str, owner_id: str) -> Row[Any] | None: ...

    async def close(self) -> None: ...


class ThreadedReader:
    """The read in the thread pool, on the API's engine."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def _read(self, job_id: str, owner_id: str) -> Row[Any] | None:
        with self._engine.connect() as connection:
            return repository.job_row(connection, job_id=job_id, owner_id=owner_id)

    async def job_row(self, *, job_id: str, owner_id: str) -> Row[Any] | None:
        return await run_in_threadpool(self._read, job_id, owner_id)

    async def close(self) -> None:
        return None


class SqliteReader:
    """The read in the event loop, through one SQLite connection with a short busy timeout."""

    def __init__(self, url: str, fallback: ThreadedReader) -> None:
        # One connection is enough: reads in the loop run one at a time and never await mid-read.
        self._engine = make_engine(url, busy_timeout_s=SQLITE_LOOP_TIMEOUT_S, poolclass=StaticPool)
        self._fallback = fallback

    async def job_row(self, *, job_id: str, owner_id: str) -> Row[Any] | None:
        try:
            with self._engine.connect() as connection:
                return repository.job_row(connection, job_id=job_id, owner_id=owner_id)
        except OperationalError:
            return await self._fallback.job_row(job_id=job_id, owner_id=owner_id)

    async def close(self) -> None:
        self._engine.dispose()


class PostgresReader:
    """The read awaited on an asyncio engine (psycopg), one engine per event loop."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._engines: dict[asyncio.AbstractEventLoop, AsyncEngine] = {}

    def _engine(self) -> AsyncEngine:
        loop = asyncio.get_running_loop()
        engine = self._engines.get(loop)
        if engine is None:
            engine = self._engines[loop] = create_async_engine(self._url, pool_pre_ping=True, pool_size=5,
                                                               max_overflow=5)
        return engine

    async def job_row(self, *, job_id: str, owner_id: str) -> Row[Any] | None:
        async with self._engine().connect() as connection:
            return await repository.job_row_async(connection, job_id=job_id, owner_id=owner_id)

    async def close(self) -> None:
        engine = self._engines.pop(asyncio.get_running_loop(), None)
        if engine is not None:
            await engine.dispose()
        for other in self._engines.values():  # pools of loops that have ended: drop without awaiting
            await other.dispose(close=False)
        self._engines.clear()


def job_reader(url: str, engine: Engine) -> JobReader:
    """The reader for this database URL (see the module docstring)."""
    parsed = make_url(url)
    threaded = ThreadedReader(engine)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        return SqliteReader(url, threaded)
    if parsed.get_backend_name() == "postgresql" and parsed.get_driver_name() == "psycopg":
        return PostgresReader(url)
    return threaded
