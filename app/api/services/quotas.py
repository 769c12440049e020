"""Per-key quotas: what one key may hold at once, so that no key can crowd the others out.

Each quota is a setting, and a request past it is answered 429 with ``Retry-After`` and a problem
``code`` naming it (:class:`~app.core.errors.QuotaExceededError`, whose body also carries ``limit`` and
``setting``):

- ``too_many_active_jobs``: queued plus running jobs (``CAHP_MAX_ACTIVE_JOBS_PER_KEY``), counted at submit
  while the key's row is locked on PostgreSQL, so concurrent submits of one key cannot pass it together
  (on SQLite, which has no row locks, they may pass it by the number sent at the same moment);
- ``too_many_event_streams``: open ``GET /v1/jobs/{id}/events`` streams (``CAHP_MAX_EVENT_STREAMS_PER_KEY``),
  counted in the API process that serves them;
- ``upload_quota_exceeded``: bytes of stored uploads (``CAHP_MAX_UPLOAD_BYTES_PER_KEY``), counted once the
  new upload's size is known and before anything is stored; the same bytes again cost nothing.

``budget_parallel`` is bounded too (``CAHP_MAX_BUDGET_PARALLEL``): a refusal at submit (422), since the job
must change, not wait.
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.core.db import ApiKey, Job, JobStatus, Upload
from app.core.errors import InvalidRequestError, QuotaExceededError
from app.core.settings import Settings

#: Seconds a refused caller is asked to wait: about how long the shortest job or stream takes to end.
RETRY_AFTER_S = 30


class BudgetParallelLimitError(InvalidRequestError):
    code = "budget_parallel_over_limit"
    title = "budget_parallel over the server's limit"


def check_budget_parallel(settings: Settings, params: dict[str, Any]) -> None:
    """Refuse a ``budget_parallel`` above ``CAHP_MAX_BUDGET_PARALLEL``: each is a piece in the shared queue."""
    asked = int(params.get("budget_parallel") or 1)
    if asked > settings.max_budget_parallel:
        raise BudgetParallelLimitError(
            f"`budget_parallel` must be at most {settings.max_budget_parallel} on this server "
            f"(CAHP_MAX_BUDGET_PARALLEL), got {asked}: each is a piece that takes a worker from the shared pool")


def check_active_jobs(session: Session, settings: Settings, *, owner_id: str) -> None:
    """Refuse a new job when ``owner_id`` already has ``CAHP_MAX_ACTIVE_JOBS_PER_KEY`` queued or running."""
    # Locks the key's row until the submit's commit (PostgreSQL; SQLite ignores it: see the module docstring).
    session.execute(select(ApiKey.id).where(ApiKey.id == owner_id).with_for_update())
    active = session.scalar(select(func.count()).select_from(Job).where(
        Job.owner_id == owner_id, Job.status.in_((JobStatus.queued.value, JobStatus.running.value)))) or 0
    limit = settings.max_active_jobs_per_key
    if active >= limit:
        raise QuotaExceededError(
            f"this API key has {active} jobs queued or running, the most one key may have "
            f"(CAHP_MAX_ACTIVE_JOBS_PER_KEY={limit}); wait for some to end, or cancel some, and submit again",
            code="too_many_active_jobs", setting="CAHP_MAX_ACTIVE_JOBS_PER_KEY", limit=limit,
            retry_after_s=RETRY_AFTER_S)


def check_upload_bytes(session: Session, settings: Settings, *, owner_id: str, incoming: int) -> None:
    """Refuse ``incoming`` more bytes when the key's stored uploads would pass ``CAHP_MAX_UPLOAD_BYTES_PER_KEY``."""
    stored = session.scalar(select(func.coalesce(func.sum(Upload.size), 0)).where(Upload.owner_id == owner_id)) or 0
    limit = settings.max_upload_bytes_per_key
    if stored + incoming > limit:
        raise QuotaExceededError(
            f"this API key stores {stored} bytes of uploads; {incoming} more would pass the {limit} one key may "
            f"store (CAHP_MAX_UPLOAD_BYTES_PER_KEY); delete uploads or jobs it no longer needs",
            code="upload_quota_exceeded", setting="CAHP_MAX_UPLOAD_BYTES_PER_KEY", limit=limit,
            retry_after_s=RETRY_AFTER_S)


class StreamSlots:
    """Open event streams per key in this API process, at most ``limit`` each."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: Counter[str] = Counter()
        self._lock = threading.Lock()

    def open(self, owner_id: str) -> _Slot:
        """Take a slot for ``owner_id``; QuotaExceededError when the key holds ``limit`` streams already."""
        with self._lock:
            if self._open[owner_id] >= self.limit:
                raise QuotaExceededError(
                    f"this API key has {self._open[owner_id]} event streams open, the most one key may hold "
                    f"(CAHP_MAX_EVENT_STREAMS_PER_KEY={self.limit}); close one, or poll GET /v1/jobs/{{id}}",
                    code="too_many_event_streams", setting="CAHP_MAX_EVENT_STREAMS_PER_KEY", limit=self.limit,
                    retry_after_s=RETRY_AFTER_S)
            self._open[owner_id] += 1
        return _Slot(self, owner_id)

    def held(self, owner_id: str) -> int:
        with self._lock:
            return self._open[owner_id]

    def _release(self, owner_id: str) -> None:
        with self._lock:
            self._open[owner_id] -= 1
            if self._open[owner_id] <= 0:
                del self._open[owner_id]


class _Slot:
    """One stream's slot: given back once, when its stream ends or is dropped unread."""

    def __init__(self, slots: StreamSlots, owner_id: str) -> None:
        self._slots, self._owner = slots, owner_id
        self._done = threading.Lock()
        self._released = False

    def release(self) -> None:
        with self._done:
            if self._released:
                return
            self._released = True
        self._slots._release(self._owner)

    def hold(self, stream: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """``stream``, giving the slot back when it ends, fails, is closed, or is dropped before it started."""

        async def held() -> AsyncIterator[bytes]:
            try:
                async for chunk in stream:
                    yield chunk
            finally:
                self.release()

        wrapped = held()
        weakref.finalize(wrapped, self.release)
        return wrapped
