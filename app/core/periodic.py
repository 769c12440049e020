"""A daemon thread that calls a function every few seconds until it is stopped.

The API's sweeper and webhook dispatcher and the worker's lease heartbeat each need one; this is the one loop
they share, and :class:`PeriodicDuty` the one way they start and stop it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Self

logger = logging.getLogger(__name__)


class Periodic:
    """Calls ``tick`` every ``interval_s`` seconds in a daemon thread.

    Parameters
    ----------
    tick : callable() -> bool or None
        The work. Returning True ends the loop (e.g. the lease keeper once the job is lost); an
        exception is logged and the loop goes on, since a database hiccup must not end the duty.
    interval_s : float
    name : str
        The thread's name, as shown in thread dumps and logs.
    immediately : bool
        Call ``tick`` once at start (the sweeper), or wait one interval first (the heartbeat).
    """

    def __init__(self, tick: Callable[[], bool | None], *, interval_s: float, name: str,
                 immediately: bool = False) -> None:
        self._tick = tick
        self._interval_s = interval_s
        self._immediately = immediately
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> Periodic:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the loop and wait for a tick in progress to finish."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def _run(self) -> None:
        if not self._immediately and self._stop.wait(self._interval_s):
            return
        while True:
            try:
                if self._tick():
                    return
            except Exception:
                logger.exception("%s failed; trying again in %s s", self._thread.name, self._interval_s)
            if self._stop.wait(self._interval_s):
                return


class PeriodicDuty:
    """A duty done by a :class:`Periodic` loop its ``__init__`` makes as ``self._loop``: started once by
    :meth:`start`, stopped by :meth:`stop` (a subclass that holds more extends it)."""

    _loop: Periodic

    def start(self) -> Self:
        self._loop.start()
        return self

    def stop(self) -> None:
        """Stop the loop and wait for a tick in progress to finish."""
        self._loop.stop()
