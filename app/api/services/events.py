"""A job's live events as Server-Sent Events: its state and its log lines, as they are written.

Workers write to the database from other processes (often other machines), so the stream reads the
database: every ``CAHP_EVENTS_POLL_S`` it reads the job row and the log lines after the last one
sent, in one short session, and sends what changed. That is one indexed read per open stream and
interval, against a request (and an API-key check) per poll for a client that polls.

Events (``data`` is JSON)::

    event: status | stage | progress   the whole job (as GET /v1/jobs/{id}), when that changed
    event: target                      a speed or FLOPs target's record (the job's ``target``), once the
                                       run has pruned to it: sent while recovery still runs
    event: log                         one log line: {offset, time, message}

Every event's ``id`` is the number of log lines sent so far. A client that reconnects sends the last one
as ``Last-Event-ID`` and gets the job's current state, then the log lines after it: nothing is lost, and
no line is sent twice. A ``target`` event comes once per connection (again after a reconnect, and again
if a later attempt of the job decided anew), before the job event of the same read. For a finished job
the stream sends the rest of the log, then the final state (an event ``status``), and ends; so a stream
always ends with the terminal status, unless the server is shutting down (the client then reconnects to
another or the restarted one) or the key was revoked. The key is checked again before every read, from
the key cache, so a revoked key's streams end within the cache's lifetime and a poll interval (its
reconnection is then a 401).
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from app.api.result_schemas import JobTarget
from app.api.schemas import JobPublic, LogLine
from app.api.services.jobs import MAX_LOG_PAGE, get_job, to_public
from app.core.db import JobStatus, repository

#: A comment line this often keeps proxies from closing a quiet stream.
KEEP_ALIVE_S = 15.0
#: What an EventSource waits before reconnecting (the ``retry`` field), in milliseconds.
RECONNECT_MS = 2000


@dataclass(frozen=True)
class _Read:
    job: JobPublic | None  # None once the job was deleted
    lines: list[LogLine]


def _read(sessions: sessionmaker[Session], *, owner_id: str, job_id: str, offset: int) -> _Read:
    # The job first, then its lines: lines written with a final status are committed with it, so a
    # finished job read here has all its lines in the read that follows.
    with sessions() as session, session.begin():
        row = repository.get_job(session, job_id=job_id, owner_id=owner_id)
        if row is None:
            return _Read(job=None, lines=[])
        job = to_public(row)
        lines = [LogLine(offset=line.line, time=line.created_at, message=line.message)
                 for line in repository.read_logs(session, job_id=job_id, offset=offset, limit=MAX_LOG_PAGE)]
    return _Read(job=job, lines=lines)


def check_job(session: Session, *, owner_id: str, job_id: str) -> None:
    """ResourceNotFoundError before the stream starts, so a wrong id is a 404 rather than an empty stream."""
    get_job(session=session, owner_id=owner_id, job_id=job_id)
    session.commit()


def _event(kind: str, data: str, event_id: int) -> bytes:
    return f"id: {event_id}\nevent: {kind}\ndata: {data}\n\n".encode()


def _change(before: JobPublic | None, now: JobPublic) -> str | None:
    if before is None or before.status != now.status:
        return "status"
    if before.stage != now.stage:
        return "stage"
    if (before.progress, before.cancel_requested) != (now.progress, now.cancel_requested):
        return "progress"
    return None


async def job_events(
    *,
    sessions: sessionmaker[Session],
    owner_id: str,
    job_id: str,
    last_event_id: int = 0,
    poll_s: float,
    draining: threading.Event | None = None,
    key_valid: Callable[[], Awaitable[bool]] | None = None,
) -> AsyncIterator[bytes]:
    """The SSE byte stream of one job, from log line ``last_event_id`` on (see the module docstring).

    ``key_valid`` is asked before each read: once it answers False (the key was revoked) the stream ends.
    """
    offset = last_event_id
    sent: JobPublic | None = None
    target_sent: JobTarget | None = None
    quiet_since = time.monotonic()
    yield f"retry: {RECONNECT_MS}\n\n".encode()
    while True:
        if key_valid is not None and not await key_valid():
            return
        read = await run_in_threadpool(_read, sessions, owner_id=owner_id, job_id=job_id, offset=offset)
        if read.job is None:
            return  # deleted meanwhile
        for line in read.lines:
            offset = line.offset + 1
            yield _event("log", line.model_dump_json(), offset)
        more = len(read.lines) == MAX_LOG_PAGE
        kind = None if more else _change(sent, read.job)
        decided = False
        if not more and read.job.target is not None and read.job.target != target_sent:
            target_sent, decided = read.job.target, True
            yield _event("target", target_sent.model_dump_json(), offset)
        if kind is not None:
            sent = read.job
            yield _event(kind, read.job.model_dump_json(), offset)
        if read.lines or kind is not None or decided:
            quiet_since = time.monotonic()
        if not more and JobStatus(read.job.status).finished:
            return
        if draining is not None and draining.is_set():
            return
        if more:
            continue
        if time.monotonic() - quiet_since >= KEEP_ALIVE_S:
            quiet_since = time.monotonic()
            yield b": keep-alive\n\n"
        await asyncio.sleep(poll_s)


#: An id as this stream gives them out: a count of log lines, in ASCII digits (``str.isdigit`` also
#: accepts ``²`` and other digits that ``int`` refuses).
_EVENT_ID = re.compile(r"[0-9]{1,10}")


def parse_last_event_id(value: str | None) -> int:
    """``Last-Event-ID`` as this stream gives it out: a count of log lines; anything else starts over.

    Anything else is ignored rather than refused: the header is an opaque string to the client, and
    an ``EventSource`` that gets an error answer stops reconnecting for good, where starting over
    only sends lines again.
    """
    if value is None:
        return 0
    text = value.strip()
    return int(text) if _EVENT_ID.fullmatch(text) else 0
