"""The heartbeat that keeps a running job's lease alive while the engine works.

The engine can spend minutes in one step without calling a hook (loading a large model, a long
forward pass over the calibration set), so the lease is renewed from a daemon thread rather than
from the progress hooks. The thread stops the job (through :attr:`LeaseKeeper.lost`) when the row
says another worker holds the job, or when it could not renew the lease for so long that the lease
may have expired: past that point the sweeper may have handed the job to someone else, and two
workers must never both believe they hold it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sqlalchemy.orm import Session, sessionmaker

from app.core.db import repository, transaction
from app.core.periodic import Periodic, PeriodicDuty

logger = logging.getLogger(__name__)


class LeaseKeeper(PeriodicDuty):
    """Renews ``job_id``'s lease for ``worker_id`` every ``interval_s`` seconds until stopped."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        *,
        job_id: str,
        worker_id: str,
        lease_s: float,
        interval_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sessions = sessions
        self.job_id = job_id
        self.worker_id = worker_id
        self._lease_s = lease_s
        self._clock = clock
        # The claim wrote a lease of lease_s just before this object was made.
        self._held_until = clock() + lease_s
        self._lost = threading.Event()
        self._loop = Periodic(self._beat_until_lost, interval_s=interval_s, name=f"lease-{job_id[:8]}")

    @property
    def lost(self) -> bool:
        """True once this worker must stop: the job is held by another worker, or may be."""
        return self._lost.is_set()

    def beat(self) -> None:
        """Renew the lease once (the thread's body; tests call it directly)."""
        started = self._clock()
        try:
            with transaction(self._sessions) as session:
                held = repository.renew_lease(session, job_id=self.job_id, worker_id=self.worker_id,
                                              lease_s=self._lease_s)
        except Exception as exc:  # the database is unreachable: keep trying while the lease lasts
            logger.warning("heartbeat of job %s failed: %s", self.job_id, exc)
            if self._clock() >= self._held_until:
                logger.error("job %s: lease not renewed for %.0f s; stopping the job", self.job_id, self._lease_s)
                self._lost.set()
            return
        if not held:
            logger.warning("job %s is no longer held by %s; stopping it", self.job_id, self.worker_id)
            self._lost.set()
        else:
            self._held_until = started + self._lease_s

    def _beat_until_lost(self) -> bool:
        self.beat()
        return self._lost.is_set()
