"""Running one job: claim it, fetch its inputs, run the engine, store the artifacts, record the end.

:func:`execute_job` is what the Celery task calls and what the worker tests call directly. It is
safe to call twice for the same job, at once or one after the other: only a ``queued`` job can be
claimed, so a second delivery finds it running or finished and returns ``skipped``.
"""

from __future__ import annotations

import enum
import logging
import os
import shutil
import socket
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from app.core.db import JobStatus, repository, transaction
from app.core.db.repository import ArtifactRecord
from app.core.errors import RegistryError, ServiceError
from app.core.inputs import InputFetcher, refuse_custom_code, storage_error
from app.core.inputs.sources import check_revision
from app.core.metrics import JOB_FAILURES, JOBS_FINISHED, QUEUE_WAIT
from app.core.params import run_config
from app.core.periodic import Periodic
from app.core.sandbox import inspection_pool
from app.core.settings import Settings
from app.core.storage import ArtifactStore
from cahp_engine.config import PruningConfig
from cahp_engine.errors import AccuracyBudgetError, CahpError, JobCancelledError, PipelineError
from cahp_engine.models import check_weight_files
from cahp_engine.run import RunHooks, RunReport, RunRequest
from worker import shutdown
from worker.artifacts import store_artifacts
from worker.candidates import PoolCandidates
from worker.claims import ClaimedJob, JobDefinition, run_request
from worker.delivery import event_details, register
from worker.handback import hand_back, job_ended
from worker.lease import LeaseKeeper
from worker.redaction import job_redactor
from worker.reporting import KEEP_ALIVE_CHECK_S, JobReporter
from worker.resume_store import ArtifactResumeStore

logger = logging.getLogger(__name__)

#: ``run_pruning``'s signature (see cahp_engine.run); tests may pass another real pipeline.
Pipeline = Callable[[RunRequest, RunHooks], RunReport]


class Outcome(enum.StrEnum):
    skipped = "skipped"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"
    #: The worker is shutting down: the job is queued again, with its resume state, for any worker to resume.
    handed_back = "handed_back"


@dataclass(frozen=True)
class WorkerContext:
    """What a worker process needs to run jobs; built once per process."""

    settings: Settings
    sessions: sessionmaker[Session]
    store: ArtifactStore
    worker_id: str
    #: Sends an accuracy budget's piece to the worker pool (None: the job's worker runs its pieces in turn).
    send_piece: Callable[[str], None] | None = None


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class _FailedWithArtifacts(Exception):
    """A failure that still left files the worker stored: a missed accuracy budget's report and plots, or a
    model whose registration failed (then with the run's ``result`` and the failed ``registration``)."""

    def __init__(self, cause: CahpError | ServiceError, artifacts: list[ArtifactRecord], *,
                 result: dict[str, Any] | None = None, registration: dict[str, Any] | None = None) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.artifacts = artifacts
        self.result = result
        self.registration = registration


def execute_job(*, job_id: str, context: WorkerContext, pipeline: Pipeline | None = None) -> Outcome:
    """Run the job ``job_id`` if it is queued, and record how it ended.

    Parameters
    ----------
    job_id : str
        The only thing the broker carries; everything else is re-read from the row.
    context : WorkerContext
        Settings, database, artifact store and this worker's id.
    pipeline : callable, optional
        ``cahp_engine.run.run_pruning`` unless given.

    Returns
    -------
    Outcome
        ``skipped`` when the job could not be claimed: finished, cancelled, held by a live worker,
        or out of attempts (the sweeper then fails it as ``worker_lost``).
    """
    settings = context.settings
    with transaction(context.sessions) as session:
        # The message is a prompt: the job started is the one whose key is owed a turn (often this one).
        job = repository.claim_next_job(session, job_id=job_id, worker_id=context.worker_id,
                                        lease_s=settings.lease_s, max_attempts=settings.max_attempts)
        if job is None:
            _log_skip(session, job_id)
            return Outcome.skipped
        job_id = job.id
        claimed = ClaimedJob(job=JobDefinition.of(job), attempt=job.attempts)
        if job.started_at is not None:
            QUEUE_WAIT.observe(max(0.0, (job.started_at - job.created_at).total_seconds()))
    lease = LeaseKeeper(context.sessions, job_id=job_id, worker_id=context.worker_id, lease_s=settings.lease_s,
                        interval_s=settings.heartbeat_interval_s).start()
    workdir = settings.resolved_work_dir / f"{job_id}.{claimed.attempt}"
    redact = job_redactor(settings, workdir)
    reporter = JobReporter(
        context.sessions, job_id=job_id, worker_id=context.worker_id,
        progress_interval_s=settings.progress_interval_s,
        cancel_check_interval_s=settings.cancel_check_interval_s,
        time_limit_s=settings.job_time_limit_s,
        lease_lost=lambda: lease.lost,
        shutting_down=lambda: shutdown.requested(settings.resolved_work_dir),
        redact=redact,
    )
    # No silence longer than KEEP_ALIVE_S in the job's log, whatever the engine is doing.
    talker = Periodic(reporter.keep_alive, interval_s=KEEP_ALIVE_CHECK_S, name=f"log-{job_id[:8]}").start()
    _remove_earlier_workdirs(settings.resolved_work_dir, job_id)
    shutil.rmtree(workdir, ignore_errors=True)
    try:
        reporter.log(f"attempt {claimed.attempt} on worker {context.worker_id}, device {settings.device}")
        report, artifacts, registration = _run(claimed, context, reporter, workdir, pipeline)
    except JobCancelledError as exc:
        return _finish_stopped(context, reporter, claimed, exc)
    except (CahpError, ServiceError, _FailedWithArtifacts) as exc:
        # A missed accuracy budget keeps the candidates' report and plots (stored by _run).
        error, stored = (exc.cause, exc.artifacts) if isinstance(exc, _FailedWithArtifacts) else (exc, [])
        logger.info("job %s failed: %s: %s", job_id, error.code, error)
        message = redact(str(error))
        reporter.log(f"failed: {error.code}: {message}")
        if stored:
            reporter.log("stored " + ", ".join(a.name for a in stored))
        failed = exc if isinstance(exc, _FailedWithArtifacts) else None
        return _finish(context, reporter, claimed, JobStatus.failed, code=error.code, message=message,
                       artifacts=stored, result=failed.result if failed else None,
                       registration=failed.registration if failed else None)
    except Exception as exc:
        full = storage_error(exc, "running the job") if isinstance(exc, OSError) else None
        if full is not None:
            logger.error("job %s: %s (%s)", job_id, full, exc)
            reporter.log(f"failed: {full.code}: {full}")
            return _finish(context, reporter, claimed, JobStatus.failed, code=full.code, message=str(full))
        # The traceback goes to the worker's log only; the caller gets an id to quote to an operator.
        error_id = uuid.uuid4().hex[:12]
        logger.exception("job %s failed unexpectedly (error id %s)", job_id, error_id)
        message = (f"the worker failed unexpectedly ({type(exc).__name__}, error id {error_id}); an operator can "
                   "find the details under that id in the worker's log")
        reporter.log(f"failed: internal_error: {message}")
        return _finish(context, reporter, claimed, JobStatus.failed, code="internal_error", message=message)
    finally:
        talker.stop()
        lease.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    result = report.summary.to_dict()
    reporter.log("succeeded; stored " + ", ".join(a.name for a in artifacts))
    return _finish(context, reporter, claimed, JobStatus.succeeded, result=result, artifacts=artifacts,
                   registration=registration, report=report)


def _log_skip(session: Session, job_id: str) -> None:
    job = repository.get_job(session, job_id=job_id)
    if job is None:
        logger.info("job %s does not exist; nothing to do", job_id)
    elif job.status == JobStatus.running.value:
        logger.info("job %s is held by %s until %s (attempt %d); nothing to do", job_id, job.worker_id,
                    job.lease_expires_at, job.attempts)
    else:
        logger.info("job %s is %s after %d attempt(s); nothing to do", job_id, job.status, job.attempts)


def _remove_earlier_workdirs(work_dir: Path, job_id: str) -> None:
    """Scratch space of attempts that died on this machine (a killed process cleans nothing up)."""
    if work_dir.is_dir():
        for stale in work_dir.glob(f"{job_id}.*"):
            shutil.rmtree(stale, ignore_errors=True)


def _run(
    claimed: ClaimedJob, context: WorkerContext, reporter: JobReporter, workdir: Path, pipeline: Pipeline | None
) -> tuple[RunReport, list[ArtifactRecord], dict[str, Any] | None]:
    settings, job = context.settings, claimed.job
    # Settings and options first: they are checked again here (a row may predate a rule), before any
    # of them is used as a file name.
    config = run_config(job.params, device=settings.device)
    reporter.measure_stages(config)
    job.dataset.options()
    if job.model.revision is not None:
        check_revision(job.model.revision, field="model.revision")
    fetcher = InputFetcher(settings=settings, sessions=context.sessions, store=context.store,
                           owner_id=job.owner_id, workdir=workdir / "inputs")
    inputs = fetcher.prepare(model=job.model.as_submitted(), dataset=dict(job.dataset.record))
    if Path(inputs.model_ref).is_dir():
        refuse_custom_code(Path(inputs.model_ref))
        check_weight_files(Path(inputs.model_ref))
    # The submit checks again, on what was fetched, in a bounded child: a hostile header, config, card
    # or split file fails the job with the limit it reached rather than growing this process.
    inspection_pool(settings).run("check_fetched", what="checking the job's model and dataset",
                                  model=inputs.model_ref, dataset=inputs.dataset_ref,
                                  dataset_record=dict(job.dataset.record), settings=settings)
    output = workdir / "output"
    if pipeline is None:
        from cahp_engine.run import run_pruning

        pipeline = run_pruning
    try:
        hooks = _hooks(claimed, context, reporter, workdir, config)
        report = pipeline(run_request(job, config, inputs, output, settings), hooks)
    except AccuracyBudgetError as exc:
        # The one failure that leaves artifacts: the report and plots of the candidates it tried.
        if not (output.is_dir() and reporter.still_held()):
            raise
        files = sorted(p.name for p in output.iterdir() if p.is_file())
        stored = list(store_artifacts(output, files, store=context.store, job_id=job.id,
                                      attempt=claimed.attempt, redact=reporter.redact))
        raise _FailedWithArtifacts(exc, stored) from exc
    if not (output / "model").is_dir():
        raise PipelineError("the run finished without writing the pruned model directory")
    if not reporter.still_held():
        # Taken over while finishing: storing now would only leave objects no row points at.
        raise JobCancelledError("this worker no longer holds the job")
    # The engine writes only its artifacts into ``output`` (model/ plus ARTIFACT_FILES).
    files = sorted(p.name for p in output.iterdir() if p.is_file())
    artifacts = store_artifacts(output, files, store=context.store, job_id=job.id,
                                attempt=claimed.attempt, redact=reporter.redact)
    registration = None
    if job.register is not None:
        reporter.log(f"registering the model as {job.register.model_name!r} in the MLflow registry")
        with transaction(context.sessions) as session:  # the job's own registration counts towards its limit
            repository.reserve_registration(session, job_id=job.id, limit=settings.max_registrations_per_job)
        outcome, error = register(settings, output=output, job_id=job.id, owner_id=job.owner_id,
                                  request=job.register, labels=job.labels, name=job.name)
        registration = outcome.to_dict()
        if error is not None:
            # One code for every way registration fails (the registry, the outbound guard, its settings).
            cause = error if isinstance(error, RegistryError) else RegistryError(
                f"the model could not be registered: {error}")
            raise _FailedWithArtifacts(cause, list(artifacts), result=report.summary.to_dict(),
                                       registration=registration)
        reporter.log(f"registered {outcome.model_uri} (run {outcome.run_id})")
    return report, artifacts, registration


def _note_resumed(context: WorkerContext, job_id: str, restored: Mapping[str, Path]) -> None:
    """The attempt's history says which saved step it goes on from."""
    from cahp_engine.run import resume_point

    point = resume_point(restored)
    if point is not None:
        with transaction(context.sessions) as session:
            repository.note_resumed_from(session, job_id=job_id, worker_id=context.worker_id, resumed_from=point)


def _hooks(claimed: ClaimedJob, context: WorkerContext, reporter: JobReporter, workdir: Path,
           config: PruningConfig) -> RunHooks:
    """What the engine reports to this worker and asks of it while it runs the job."""
    settings = context.settings
    # An accuracy budget's candidates across the pool (worker.candidates); else the engine runs them in turn.
    pool = None if context.send_piece is None or config.max_accuracy_drop is None else PoolCandidates(
        context, job_id=claimed.job.id, attempt=claimed.attempt, send=context.send_piece, local=workdir / "pieces",
        say=reporter.log, should_cancel=reporter.should_cancel)
    return RunHooks(
        progress=reporter.progress,
        plan=reporter.plan,
        target_decided=reporter.target_decided,
        should_cancel=reporter.should_cancel,
        log=reporter.log,
        # Each stage and fine-tuning stop saved to the artifact store; an earlier attempt's resumed.
        resume_store=ArtifactResumeStore(context.store, job_id=claimed.job.id, local=workdir / "checkpoints",
                                         on_restore=lambda restored: _note_resumed(context, claimed.job.id, restored)),
        save_interval_s=settings.checkpoint_interval_s,
        # A worker shutting down saves the fine-tuning at its last step before handing the job back.
        save_when_stopped=lambda: reporter.stop_reason == "shutdown",
        candidates=pool,
    )


def _finish_stopped(
    context: WorkerContext, reporter: JobReporter, claimed: ClaimedJob, exc: JobCancelledError
) -> Outcome:
    if reporter.stop_reason == "shutdown" and hand_back(reporter, attempt=claimed.attempt):
        return Outcome.handed_back
    if reporter.stop_reason == "time_limit":
        limit = context.settings.job_time_limit_s
        message = f"the job ran longer than the limit of {limit} s (CAHP_JOB_TIME_LIMIT_S) and was stopped"
        reporter.log(message)
        return _finish(context, reporter, claimed, JobStatus.failed, code="time_limit", message=message)
    if reporter.stop_reason == "lost":
        reporter.log(f"stopped: worker {context.worker_id} no longer holds this job")
    else:
        reporter.log("cancelled on request")
    # For a lost job, _finish records nothing: the job is no longer held by this worker.
    return _finish(context, reporter, claimed, JobStatus.cancelled, code=exc.code, message="cancelled on request")


def _finish(
    context: WorkerContext,
    reporter: JobReporter,
    claimed: ClaimedJob,
    status: JobStatus,
    *,
    code: str | None = None,
    message: str | None = None,
    result: dict[str, Any] | None = None,
    artifacts: list[ArtifactRecord] | None = None,
    registration: dict[str, Any] | None = None,
    report: RunReport | None = None,
) -> Outcome:
    reporter.end_stage()
    # The event's receivers fetch the model through these links, without the submitter's key, and
    # read what the model is and how it was made.
    details = event_details(context.settings, context.store, job_id=claimed.job.id, owner_id=claimed.job.owner_id,
                            artifacts=artifacts or (), report=report)
    with transaction(context.sessions) as session:
        recorded = repository.finish_job(
            session, job_id=claimed.job.id, worker_id=context.worker_id, status=status, error_code=code,
            error_message=message, result=result, artifacts=artifacts or (), messages=reporter.drain(),
            registration=registration, event_details=details,
        )
        ended = repository.get_job(session, job_id=claimed.job.id) if recorded else None
        created_at = ended.created_at if ended is not None else None
    if recorded:
        job_ended(context.store, job_id=claimed.job.id, status=status, created_at=created_at)
        JOBS_FINISHED.labels(status.value).inc()
        if status is JobStatus.failed:
            JOB_FAILURES.labels(code or "unknown").inc()
    if not recorded:
        # Another worker took the job over (this one's lease expired): what this attempt stored is
        # referenced by no row, so it is removed rather than left to look like a result.
        logger.warning("job %s was no longer held by %s; its end (%s) was not recorded",
                       claimed.job.id, context.worker_id, status)
        for artifact in artifacts or ():
            try:
                context.store.delete(artifact.storage_key)
            except Exception as exc:
                logger.warning("could not delete %s: %s", artifact.storage_key, exc)
        return Outcome.skipped
    return Outcome(status.value)
