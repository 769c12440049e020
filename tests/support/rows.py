"""Rows in a given state, written straight through the repository: a key's owner, a queued job, a running
job, a job's row read back, and a clock the tests move by hand."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from app.core.db import Job, repository, transaction
from app.core.security import generate_key


class Clock:
    """A clock that stands still until a test moves ``now``."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def add_owner(sessions: sessionmaker[Session], name: str = "owner") -> str:
    """The id of a new API key: the owner of the jobs a test adds."""
    new = generate_key()
    with transaction(sessions) as session:
        repository.add_api_key(session, key_id=new.id, name=name, key_hash=new.key_hash)
    return new.id


def add_job(sessions: sessionmaker[Session], owner: str | None = None, *, key: str | None = None,
            when: dt.datetime | None = None, job_id: str | None = None, **fields: Any) -> str:
    """A queued job of ``owner`` (a new one when None); ``fields`` override the row's columns."""
    values: dict[str, Any] = {"model_uri": "hf://org/name", "dataset": {"uri": "hf://datasets/org/data"},
                              "params": {"epochs": 1}, "request_hash": "0" * 64} | fields
    job = Job(id=job_id or uuid.uuid4().hex, owner_id=owner or add_owner(sessions, "t"), idempotency_key=key,
              **values)
    if when is not None:
        job.created_at = when
    with transaction(sessions) as session:
        repository.add_job(session, job)
    return job.id


def running_job(sessions: sessionmaker[Session], *, worker: str = "w") -> str:
    """A job of a new owner, claimed by ``worker``."""
    job_id = add_job(sessions)
    with transaction(sessions) as session:
        assert repository.claim_job(session, job_id=job_id, worker_id=worker) is not None
    return job_id


def job_row(sessions: sessionmaker[Session], job_id: str) -> Job:
    """The job's row as the database holds it now."""
    with sessions() as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job
