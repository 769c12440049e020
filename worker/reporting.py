"""The engine's progress, log and cancellation hooks, backed by the job row and throttled.

The engine calls ``progress`` and ``should_cancel`` often (every training step). Writing the row
each time would load the database for nothing, so progress is written when the stage changes or
``progress_interval_s`` has passed, log lines are written in batches on the same rhythm, and the
cancel flag is read at most every ``cancel_check_interval_s``. Each write also tells whether this
worker still holds the job; a worker that lost it (or whose heartbeat, :mod:`worker.lease`, says so)
stops, as it would for a cancel, and its log lines are dropped with everything else it would write.
A worker that is shutting down (:mod:`worker.shutdown`) stops the same way, to hand the job back.
Each progress write carries ``eta_s``: the time the attempt still needs, from the measured throughput
of its stages once the run's settings are known (:meth:`JobReporter.measure_stages`,
:class:`cahp_engine.progress.ThroughputEta`), else at the overall pace of its last ten minutes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Literal

from sqlalchemy.orm import Session, sessionmaker

from app.core.db import repository, transaction
from app.core.metrics import STAGE_DURATION

logger = logging.getLogger(__name__)

#: Longest log line kept; longer ones are cut (a stray tensor print should not fill the database).
MAX_LOG_LINE = 4000
StopReason = Literal["cancel_requested", "time_limit", "lost", "shutdown"]
#: The pace behind ``eta_s`` is measured over this much of the attempt's recent past, in seconds.
ETA_WINDOW_S = 600.0
#: No estimate before the attempt has been measured this long, in seconds.
ETA_MIN_S = 30.0
#: The longest a running job's log stays quiet, in seconds (:meth:`JobReporter.keep_alive`).
KEEP_ALIVE_S = 30.0
#: How often the worker asks :meth:`JobReporter.keep_alive` whether to speak; a line is due this much
#: before KEEP_ALIVE_S of quiet, so that no silence, checks' spacing included, exceeds KEEP_ALIVE_S.
KEEP_ALIVE_CHECK_S = 5.0


class JobReporter:
    """Hooks for one run of one job by one worker (``progress``, ``log``, ``should_cancel``)."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        *,
        job_id: str,
        worker_id: str,
        progress_interval_s: float,
        cancel_check_interval_s: float,
        time_limit_s: float,
        lease_lost: Callable[[], bool] = lambda: False,
        shutting_down: Callable[[], bool] = lambda: False,
        clock: Callable[[], float] = time.monotonic,
        redact: Callable[[str], str] = str,
    ) -> None:
        self._sessions = sessions
        self.job_id = job_id
        self.worker_id = worker_id
        self._progress_interval = progress_interval_s
        self._cancel_interval = cancel_check_interval_s
        self._clock = clock
        self._lease_lost = lease_lost
        self._shutting_down = shutting_down
        self._paces: deque[tuple[float, float]] = deque()
        self._stage_eta: Any = None  # a ThroughputEta once measure_stages was called
        self.redact = redact
        self._deadline = clock() + time_limit_s
        self._stage: str | None = None
        self._stage_started: float | None = None
        self._fraction = 0.0
        self._last_write = float("-inf")
        self._last_check = float("-inf")
        self._pending: list[str] = []
        self._last_line = clock()
        self._drained = False
        # The keep-alive thread (keep_alive) logs too: one writer at a time.
        self._lock = threading.RLock()
        self.stop_reason: StopReason | None = None

    # --- hooks the engine calls --------------------------------------------------------------------

    def progress(self, stage: str, fraction: float) -> None:
        with self._lock:
            now = self._clock()
            changed = stage != self._stage
            if changed:
                self.end_stage(now)
                self._stage_started = now
            self._stage, self._fraction = stage, fraction
            if changed or now - self._last_write >= self._progress_interval:
                self._write(now)

    def log(self, message: str) -> None:
        with self._lock:
            for line in self.redact(str(message)).splitlines() or [""]:
                self._pending.append(line if len(line) <= MAX_LOG_LINE else line[:MAX_LOG_LINE] + " [...]")
            self._last_line = self._clock()
            if self._clock() - self._last_write >= self._progress_interval:
                self._write(self._clock())

    def keep_alive(self, quiet_s: float = KEEP_ALIVE_S - KEEP_ALIVE_CHECK_S) -> None:
        """A line when the log has been quiet for ``quiet_s`` (a step that logs nothing: loading, an
        export's latency rounds, a teacher pass), so that a slow job never looks like a hung one. Called
        from a thread."""
        with self._lock:
            now = self._clock()
            if (self._drained or self._stage is None or self._stage_started is None
                    or now - self._last_line < quiet_s):
                return
            self.log(f"{self._stage}: still working, {now - self._stage_started:.0f} s into this stage "
                     f"({self._fraction:.0%} of the job done)")

    def should_cancel(self) -> bool:
        now = self._clock()
        if self.stop_reason is None and self._lease_lost():
            self.stop_reason = "lost"
        if self.stop_reason is None and self._shutting_down():
            self.stop_reason = "shutdown"
        if self.stop_reason is None and now >= self._deadline:
            self.stop_reason = "time_limit"
        if self.stop_reason is None and now - self._last_check >= self._cancel_interval:
            with transaction(self._sessions) as session:
                ack = repository.job_control(session, job_id=self.job_id, worker_id=self.worker_id)
            self._last_check = now
            self._note(ack)
        return self.stop_reason is not None

    # --- plumbing ----------------------------------------------------------------------------------

    @property
    def sessions(self) -> sessionmaker[Session]:
        return self._sessions

    def flush(self) -> None:
        """Write buffered log lines now (while the job is still held)."""
        with self._lock:
            if self._pending:
                self._write(self._clock())

    def still_held(self) -> bool:
        """Write progress and buffered lines now, and say whether this worker still holds the job."""
        if self._lease_lost():
            self.stop_reason = "lost"
        else:
            with self._lock:
                self._write(self._clock())
        return self.stop_reason != "lost"

    def end_stage(self, now: float | None = None) -> None:
        """Count the time spent in the current stage (``cahp_job_stage_duration_seconds``)."""
        if self._stage is not None and self._stage_started is not None:
            elapsed = (self._clock() if now is None else now) - self._stage_started
            STAGE_DURATION.labels(self._stage).observe(max(0.0, elapsed))
        self._stage_started = None

    def drain(self) -> list[str]:
        """Take the buffered log lines, to be written with the job's end (:func:`repository.finish_job`)."""
        with self._lock:
            lines, self._pending = self._pending, []
            self._drained = True  # the end is being recorded: keep_alive adds nothing after it
        return lines

    def measure_stages(self, config: Any) -> None:
        """Estimate the time left from each stage's measured throughput, for a run with ``config`` (a
        :class:`~cahp_engine.config.PruningConfig`): the stages it runs and their calibrated shares."""
        from cahp_engine.progress import ThroughputEta, stage_plan

        plan = stage_plan(config)
        with self._lock:
            self._stage_eta = ThroughputEta(plan.spans, plan.costs)

    def plan(self, plan: Any) -> None:
        """Hear the run's :class:`~cahp_engine.progress.StagePlan` once its rows are known (the engine's
        ``plan`` hook): the time left follows its stages' shares and costs from then on."""
        from cahp_engine.progress import ThroughputEta

        with self._lock:
            if self._stage_eta is None:
                self._stage_eta = ThroughputEta(plan.spans, plan.costs)
            else:
                self._stage_eta.replan(plan)

    def target_decided(self, record: Any) -> None:
        """Write a target run's record (a :class:`cahp_engine.run.TargetRecord`, from the engine's
        ``target_decided`` hook) now, after the log lines before it: the job's event stream sends it
        while reconstruction and recovery still run."""
        with self._lock:
            self._write(self._clock())
            with transaction(self._sessions) as session:
                held = repository.report_target(session, job_id=self.job_id, worker_id=self.worker_id,
                                                target=record.to_dict())
            if not held and self.stop_reason is None:
                logger.warning("job %s is no longer held by %s; stopping it", self.job_id, self.worker_id)
                self.stop_reason = "lost"

    def eta_s(self, now: float) -> float | None:
        """Seconds the attempt still needs (None: not measured yet): by its stages' throughput after
        :meth:`measure_stages`, else at the overall pace of its last :data:`ETA_WINDOW_S`."""
        if self._stage_eta is not None:
            return None if self._stage is None else self._stage_eta.update(now, self._stage, self._fraction)
        self._paces.append((now, self._fraction))
        while len(self._paces) > 2 and now - self._paces[1][0] >= ETA_WINDOW_S:
            self._paces.popleft()
        then, before = self._paces[0]
        if now - then < ETA_MIN_S or self._fraction - before <= 1e-4:
            return None
        return (1.0 - self._fraction) * (now - then) / (self._fraction - before)

    def _write(self, now: float) -> None:
        lines, self._pending = self._pending, []
        eta = self.eta_s(now)
        with transaction(self._sessions) as session:
            ack = repository.report_progress(
                session, job_id=self.job_id, worker_id=self.worker_id, stage=self._stage, progress=self._fraction,
                messages=lines, eta_s=eta,
            )
        self._last_write = self._last_check = now
        self._note(ack)

    def _note(self, ack: repository.ProgressAck) -> None:
        if self.stop_reason is not None:
            return
        if not ack.held:
            logger.warning("job %s is no longer held by %s; stopping it", self.job_id, self.worker_id)
            self.stop_reason = "lost"
        elif ack.cancel_requested:
            self.stop_reason = "cancel_requested"
