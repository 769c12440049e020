"""Reading a job for a status poll without a turn in the thread pool.

Profiling the poll (docs/performance.md) showed that handing the read to a worker thread and back
cost several times the read itself once 50 clients poll at once: each hand-off wakes a thread,
and the threads then fight the event loop for the GIL. So the status route reads in the event loop:

- **SQLite** through one connection of the reader's own. In WAL mode a reader never waits for a
  writer, and reading one row by its key is a few tens of microseconds from the page cache. The
  connection's busy timeout is 20 ms, not 30 s: should the file be busy anyway (WAL recovery after a
  crash), the read goes to the thread pool and the loop is held for at most that long.
- **PostgreSQL** through psycopg's async connections: the query's round trip is awaited, not
  waited for. Autocommit, so a read is one round trip, not three (``BEGIN``, the query,
  ``ROLLBACK``), on a cursor kept per connection and a statement prepared on the server. One small
  pool per event loop (connections belong to the loop that made them).
- Any other driver: the thread pool, as every other route.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import weakref
from typing import Any, Protocol

import psycopg
from psycopg.rows import namedtuple_row
from sqlalchemy import Engine, Row, make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import StaticPool
from starlette.concurrency import run_in_threadpool

from app.core.db import make_engine, repository
from app.core.errors import UnavailableError

#: Longest a SQLite read may hold the event loop before it is handed to the thread pool.
SQLITE_LOOP_TIMEOUT_S = 0.02


class JobReader(Protocol):
    """``job_row`` answers the job's columns as attributes (a row), or None for no such job of the key;
    ``attempt_rows`` its attempts, oldest first (read only for a job that has started)."""

    async def job_row(self, *, job_id: str, owner_id: str) -> Any: ...

    async def attempt_rows(self, *, job_id: str) -> list[Any]: ...

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

    def _read_attempts(self, job_id: str) -> list[Row[Any]]:
        with self._engine.connect() as connection:
            return repository.attempt_rows(connection, job_id=job_id)

    async def attempt_rows(self, *, job_id: str) -> list[Row[Any]]:
        return await run_in_threadpool(self._read_attempts, job_id)

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

    async def attempt_rows(self, *, job_id: str) -> list[Row[Any]]:
        try:
            with self._engine.connect() as connection:
                return repository.attempt_rows(connection, job_id=job_id)
        except OperationalError:
            return await self._fallback.attempt_rows(job_id=job_id)

    async def close(self) -> None:
        self._engine.dispose()


class _Pool:
    """A few psycopg async connections of one event loop, made on demand, reused last-in first-out.

    The queue holds idle connections on top of ``size`` placeholders (None): taking a placeholder
    means "make a connection"; a closed connection gives its placeholder back. No lock: a request
    waits on the queue only when all ``size`` connections are busy.
    """

    def __init__(self, conninfo: str, size: int) -> None:
        self._conninfo = conninfo
        self._queue: asyncio.LifoQueue[psycopg.AsyncConnection[Any] | None] = asyncio.LifoQueue()
        for _ in range(size):
            self._queue.put_nowait(None)

    async def get(self) -> psycopg.AsyncConnection[Any]:
        connection = await self._queue.get()
        if connection is not None:
            return connection
        try:
            connection = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True,
                                                               row_factory=namedtuple_row)
            await connection.execute("SET TIME ZONE 'UTC'")
        except BaseException:
            self._queue.put_nowait(None)
            raise
        return connection

    def put(self, connection: psycopg.AsyncConnection[Any]) -> None:
        self._queue.put_nowait(connection)

    async def discard(self, connection: psycopg.AsyncConnection[Any]) -> None:
        try:
            await connection.close()
        finally:
            self._queue.put_nowait(None)

    async def close(self) -> None:
        while not self._queue.empty():
            connection = self._queue.get_nowait()
            if connection is not None:
                await connection.close()


class PostgresReader:
    """The read awaited on psycopg's async connections, one small pool per event loop.

    psycopg directly, not SQLAlchemy's asyncio layer: measured on this read, that layer (greenlets and
    adapters around every call) cost 470 us of CPU against psycopg's 74 us. The statement is still
    the repository's (:func:`app.core.db.repository.job_row_sql`), compiled once.
    """

    POOL_SIZE = 5

    def __init__(self, url: str) -> None:
        from sqlalchemy.dialects.postgresql.psycopg import dialect

        self._conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        self._sql = repository.job_row_sql(dialect())
        self._attempts_sql = repository.attempt_rows_sql(dialect())
        self._pools: dict[asyncio.AbstractEventLoop, _Pool] = {}
        self._cursors: weakref.WeakKeyDictionary[psycopg.AsyncConnection[Any], psycopg.AsyncCursor[Any]] = (
            weakref.WeakKeyDictionary())

    def _pool(self) -> _Pool:
        loop = asyncio.get_running_loop()
        pool = self._pools.get(loop)
        if pool is None:
            pool = self._pools[loop] = _Pool(self._conninfo, self.POOL_SIZE)
        return pool

    async def job_row(self, *, job_id: str, owner_id: str) -> Any:
        rows = await self._fetch(self._sql, {"job_id": job_id, "owner_id": owner_id}, one=True)
        return rows[0] if rows else None

    async def attempt_rows(self, *, job_id: str) -> list[Any]:
        return await self._fetch(self._attempts_sql, {"job_id": job_id}, one=False)

    async def _fetch(self, sql: str, params: dict[str, Any], *, one: bool) -> list[Any]:
        pool = self._pool()
        for attempt in (1, 2):
            connection = await pool.get()
            try:
                cursor = self._cursors.get(connection)
                if cursor is None:
                    cursor = self._cursors[connection] = connection.cursor()
                await cursor.execute(sql, params, prepare=True)
                rows = [row for row in [await cursor.fetchone()] if row is not None] if one else await cursor.fetchall()
            except psycopg.OperationalError as exc:
                # A connection the server dropped (restart, idle timeout): the second try gets a new one.
                await pool.discard(connection)
                if attempt == 2:
                    raise UnavailableError(f"the job database cannot be reached: {exc}") from exc
                continue
            except BaseException:
                await pool.discard(connection)  # cancelled mid-query, say: its state is unknown
                raise
            pool.put(connection)
            return [_utc(row) for row in rows]
        raise AssertionError("unreachable")

    async def close(self) -> None:
        pool = self._pools.pop(asyncio.get_running_loop(), None)
        if pool is not None:
            await pool.close()
        self._pools.clear()  # pools of loops that have ended hold connections of no use


def _utc(row: Any) -> Any:
    """The row with its times in UTC, as SQLAlchemy's ``UTCDateTime`` gives them everywhere else."""
    return row._replace(**{k: v.astimezone(dt.UTC) for k, v in row._asdict().items() if isinstance(v, dt.datetime)})


def job_reader(url: str, engine: Engine) -> JobReader:
    """The reader for this database URL (see the module docstring)."""
    parsed = make_url(url)
    threaded = ThreadedReader(engine)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        return SqliteReader(url, threaded)
    if parsed.get_backend_name() == "postgresql" and parsed.get_driver_name() == "psycopg":
        return PostgresReader(url)
    return threaded
