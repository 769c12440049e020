"""FastAPI dependencies, as ``Annotated`` aliases the routes declare their parameters with.

Cheap on purpose: FastAPI runs a plain ``def`` dependency in the thread pool, and every turn there
costs a thread hand-off that under load costs more than the query it wraps. So the dependencies that
do no I/O are ``async def``, and the API key check answers from the key cache
(:class:`app.core.security.KeyCache`) without leaving the event loop, going to the database (in the
thread pool) only on a miss.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from app.api.background import JobQueue
from app.api.job_reader import JobReader
from app.core.db import transaction
from app.core.errors import AuthenticationError
from app.core.security import LOCAL_PRINCIPAL_ID, KeyCache, Principal, authenticate
from app.core.settings import Settings
from app.core.storage import ArtifactStore

_bearer = HTTPBearer(auto_error=False, description="An API key from `cahp keys create --name NAME`")


async def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def _session(request: Request) -> Iterator[Session]:
    with request.app.state.sessions() as session:
        yield session


async def _store(request: Request) -> ArtifactStore:
    store: ArtifactStore = request.app.state.store
    return store


async def _queue(request: Request) -> JobQueue:
    queue: JobQueue = request.app.state.queue
    return queue


async def _job_reader(request: Request) -> JobReader:
    reader: JobReader = request.app.state.job_reader
    return reader


SettingsDep = Annotated[Settings, Depends(_settings)]
SessionDep = Annotated[Session, Depends(_session)]
#: Reads a job for a status poll without a thread-pool turn (app.api.job_reader).
JobReaderDep = Annotated[JobReader, Depends(_job_reader)]
StoreDep = Annotated[ArtifactStore, Depends(_store)]
QueueDep = Annotated[JobQueue, Depends(_queue)]


async def _principal(request: Request, key: str) -> Principal:
    """The key's principal, from the key cache or else the database; AuthenticationError if it is not valid."""
    cache: KeyCache = request.app.state.key_cache
    found = cache.get(key)
    if found is None:
        found = await run_in_threadpool(_check_key, request.app.state.sessions, key)
        cache.put(key, found)
    return found


async def _api_key(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    settings: Settings = request.app.state.settings
    if credentials is not None:
        return await _principal(request, credentials.credentials)
    if settings.no_auth:
        return Principal(id=LOCAL_PRINCIPAL_ID, name="local (no-auth)")  # its row is made at start-up
    raise AuthenticationError("send an API key as `Authorization: Bearer <key>`")


#: Answers whether the key the request presented is still valid (see :data:`KeyCheckDep`).
KeyCheck = Callable[[], Awaitable[bool]]


async def _key_check(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> KeyCheck:
    async def still_valid() -> bool:
        if credentials is None:
            return True  # admitted without a key: the server runs with --no-auth
        try:
            await _principal(request, credentials.credentials)
        except AuthenticationError:
            return False
        return True

    return still_valid


def _check_key(sessions: sessionmaker[Session], key: str) -> Principal:
    # A session of its own, committed at once: no connection is held while the route runs (or while
    # an upload's body arrives), so waiting requests cannot starve the pool.
    with transaction(sessions) as session:
        row = authenticate(session=session, key=key)
        return Principal(id=row.id, name=row.name)


ApiKeyDep = Annotated[Principal, Depends(_api_key)]
#: For a response that outlives its request (an event stream): checks the request's key again, from
#: the key cache, so a revoked key is refused within the cache's lifetime there too.
KeyCheckDep = Annotated[KeyCheck, Depends(_key_check)]
