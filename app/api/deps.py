"""FastAPI dependencies, as ``Annotated`` aliases the routes declare their parameters with."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from app.api.producer import JobQueue
from app.core import keys
from app.core.errors import AuthenticationError
from app.core.models import ApiKey
from app.core.settings import Settings
from app.core.storage import ArtifactStore

_bearer = HTTPBearer(auto_error=False, description="An API key from `cahp keys create --name NAME`")


def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def _session(request: Request) -> Iterator[Session]:
    with request.app.state.sessions() as session:
        yield session


def _store(request: Request) -> ArtifactStore:
    store: ArtifactStore = request.app.state.store
    return store


def _queue(request: Request) -> JobQueue:
    queue: JobQueue = request.app.state.queue
    return queue


SettingsDep = Annotated[Settings, Depends(_settings)]
SessionDep = Annotated[Session, Depends(_session)]
StoreDep = Annotated[ArtifactStore, Depends(_store)]
QueueDep = Annotated[JobQueue, Depends(_queue)]


def _api_key(
    settings: SettingsDep,
    session: SessionDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> ApiKey:
    if credentials is not None:
        key = keys.authenticate(session=session, key=credentials.credentials)
        # End the read transaction so its pooled connection goes back now. FastAPI runs this
        # dependency and the route in separate threadpool turns; a connection held across the gap
        # lets 40 waiting requests (the threadpool) starve the 15 the pool has, and every request
        # then waits for the pool timeout. An upload would also hold it while its body arrives.
        session.commit()
        return key
    if settings.no_auth:
        return keys.local_principal(session=session)
    raise AuthenticationError("send an API key as `Authorization: Bearer <key>`")


ApiKeyDep = Annotated[ApiKey, Depends(_api_key)]
