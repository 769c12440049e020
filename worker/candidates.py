"""An accuracy budget's candidates across the worker pool: the search's side and a piece's side.

The engine's search hands each rung of successive halving to a
:class:`~cahp_engine.run.CandidateExecutor` and waits for the whole rung
(:mod:`cahp_engine.run._budget`). :class:`PoolCandidates` is that executor in the job service: it
records the rung's pieces in ``budget_pieces`` (:mod:`app.core.db.repository._pieces`), sends one
message per piece (:data:`PIECE_TASK_NAME`) and waits. Any worker that takes a message claims the
piece (a conditional ``UPDATE``, like a job), renews its lease while it trains and records the result;
the search's own worker claims the pieces nobody has taken yet, so a pool of one worker (or a pool
whose other workers are busy) runs them in turn. A piece whose worker is lost (its lease lapses) goes
back to the queue and is sent again: a candidate is carried from one piece to the next as a state in
the artifact store (:func:`~cahp_engine.run.save_candidate`, under the job's resume state), so the
piece is run again from the same state and gives the same result. Pieces are deterministic and the
search decides on whole rungs, so the answer is the one-worker search's.

:func:`run_piece` is the other side, what the piece's task calls: it rebuilds the search's inputs
from the job's inputs and resume state once per job attempt and process
(:func:`~cahp_engine.run.candidate_inputs`), then trains the piece.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from app.core.db import repository, transaction
from app.core.inputs import InputFetcher, refuse_custom_code
from app.core.params import run_config
from app.core.periodic import Periodic
from app.core.storage import ArtifactStore, resume_prefix
from cahp_engine.errors import JobCancelledError
from cahp_engine.models import check_weight_files
from cahp_engine.results import DropInterval, ValidationPoint
from cahp_engine.run import (
    CANDIDATE_FILES,
    CandidateResult,
    CandidateRun,
    CandidateSpec,
    RunHooks,
    SearchInputs,
    candidate_inputs,
    load_candidate,
    recover_candidate,
    save_candidate,
)
from worker import shutdown
from worker.claims import ClaimedPiece, JobDefinition, run_request
from worker.resume_store import ArtifactResumeStore

logger = logging.getLogger(__name__)

PIECE_TASK_NAME = "cahp.run_budget_piece"
#: Statuses after which a candidate may be trained on (or chosen): its state is kept for that.
_RESUMABLE = ("paused", "within_budget")


class PoolCandidates:
    """The search's executor in a worker: pieces recorded, sent to the pool, and run here when nobody takes them.

    Parameters
    ----------
    context : WorkerContext
        Settings, sessions, store and this worker's id (the job's holder).
    job_id, attempt : str, int
        The job and the attempt whose search this is.
    send : callable(str)
        Sends a piece's message (its id) to the queue.
    local : path
        Scratch space for candidate states.
    say : callable(str)
        The job's log.
    should_cancel : callable() -> bool
        The job's cancel check (cancel, lost lease, shutdown, time limit).
    """

    def __init__(self, context: Any, *, job_id: str, attempt: int, send: Callable[[str], None], local: Path,
                 say: Callable[[str], None], should_cancel: Callable[[], bool], poll_s: float = 0.5) -> None:
        self._context, self._job_id, self._attempt = context, job_id, attempt
        self._send, self._local, self._say, self._should_cancel = send, local, say, should_cancel
        self._poll_s = poll_s
        self._pieces: dict[str, int] = {}
        self._states: dict[str, str] = {}

    def run(self, pieces: Sequence[CandidateSpec], inputs: SearchInputs) -> list[CandidateResult]:
        try:
            return self._run(pieces, inputs)
        except BaseException:
            # Stopped (cancelled, handed back, failed): no worker goes on with a piece of this search.
            with transaction(self._context.sessions) as session:
                repository.cancel_pieces(session, job_id=self._job_id)
            raise

    def _run(self, pieces: Sequence[CandidateSpec], inputs: SearchInputs) -> list[CandidateResult]:
        sessions = self._context.sessions
        new = [repository.NewPiece(candidate=spec.key, piece=self._pieces.get(spec.key, 0), spec=spec.to_dict(),
                                   resume_from=self._states.get(spec.key)) for spec in pieces]
        with transaction(sessions) as session:
            ids = repository.add_pieces(session, job_id=self._job_id, attempt=self._attempt, pieces=new)
        for piece_id in ids:
            self._post(piece_id)
        pending, done = list(ids), {}
        while pending:
            if self._should_cancel():
                raise JobCancelledError("the job was stopped during its accuracy budget's search")
            with transaction(sessions) as session:
                requeued = repository.requeue_lost_pieces(session, piece_ids=pending)
                rows = {row.id: (row.status, row.result, row.worker_id, row.attempts)
                        for row in repository.get_pieces(session, piece_ids=pending)}
            # Logged and sent once committed: the log writes in a transaction of its own (on SQLite it
            # would wait for this one), and a worker must find the piece queued when its message comes.
            for lost in requeued:
                self._say(f"budget: piece {lost[:8]} lost its worker; it is queued again")
                self._post(lost)
            for piece_id in list(pending):
                status, result, worker_id, attempts = rows[piece_id]
                if status == "done" and result is not None:
                    done[piece_id] = result
                    pending.remove(piece_id)
                    note = f" (run {attempts} times: its earlier workers were lost)" if attempts > 1 else ""
                    self._say(f"budget: piece {piece_id[:8]} ran on worker {worker_id}{note}")
                elif status == "cancelled":
                    raise JobCancelledError("the accuracy budget's pieces were cancelled")
            queued = [piece_id for piece_id in pending if rows[piece_id][0] == "queued"]
            if not queued or not self._run_one(queued, inputs):
                time.sleep(self._poll_s)
        out = []
        for spec, piece_id in zip(pieces, ids, strict=True):
            outcome = done[piece_id]
            self._pieces[spec.key] = self._pieces.get(spec.key, 0) + 1
            previous, state = self._states.get(spec.key), outcome.get("state")
            if state:
                self._states[spec.key] = state
            if previous and previous != state:
                self._delete(previous)
            if inputs.steps_done is not None:
                inputs.steps_done(int(outcome.get("steps", 0)))
            out.append(decode_result(outcome["result"]))
        return out

    def resume(self, spec: CandidateSpec, inputs: SearchInputs) -> CandidateRun:
        prefix = self._states.get(spec.key)
        if prefix is None:
            raise JobCancelledError(f"the candidate {spec.key} has no saved state to go on from")
        directory = fetch_state(self._context.store, prefix, self._local / f"resume-{uuid.uuid4().hex[:8]}")
        try:
            return load_candidate(spec, inputs, directory)
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    def release(self, spec: CandidateSpec) -> None:
        prefix = self._states.pop(spec.key, None)
        if prefix is not None:
            self._delete(prefix)

    # --- plumbing ----------------------------------------------------------------------------------

    def _post(self, piece_id: str) -> None:
        try:
            self._send(piece_id)
        except Exception as exc:  # the search's own worker runs it when nobody else can get it
            logger.warning("budget piece %s of job %s could not be sent (%s); it runs here", piece_id,
                           self._job_id, exc)

    def _run_one(self, queued: list[str], inputs: SearchInputs) -> bool:
        """Claim one of ``queued`` and run it here; False when another worker took each of them first."""
        context = self._context
        for piece_id in queued:
            with transaction(context.sessions) as session:
                row = repository.claim_piece(session, piece_id=piece_id, worker_id=context.worker_id,
                                             lease_s=context.settings.lease_s)
                claimed = None if row is None else ClaimedPiece.of(row)
            if claimed is None:
                continue
            with PieceLease(context, piece_id) as lease:
                cancel = _either(self._should_cancel, lease.lost)
                outcome = execute_piece(claimed, _with_cancel(inputs, cancel), context.store, local=self._local)
            with transaction(context.sessions) as session:
                repository.finish_piece(session, piece_id=piece_id, worker_id=context.worker_id, result=outcome)
            return True
        return False

    def _delete(self, prefix: str) -> None:
        try:
            self._context.store.delete_prefix(prefix)
        except Exception as exc:  # removed with the job's resume state at its end
            logger.warning("could not delete the candidate state %s: %s", prefix, exc)


class PieceLease:
    """Renews a held piece's lease in a thread while it runs; ``lost()`` once it is not held any more."""

    def __init__(self, context: Any, piece_id: str) -> None:
        self._context, self._piece_id = context, piece_id
        self._lost = threading.Event()
        self._keeper: Periodic | None = None

    def lost(self) -> bool:
        return self._lost.is_set()

    def _renew(self) -> bool:
        context = self._context
        with transaction(context.sessions) as session:
            held = repository.renew_piece(session, piece_id=self._piece_id, worker_id=context.worker_id,
                                          lease_s=context.settings.lease_s)
        if not held:
            self._lost.set()
        return not held

    def __enter__(self) -> PieceLease:
        interval = self._context.settings.heartbeat_interval_s
        self._keeper = Periodic(self._renew, interval_s=interval, name=f"piece-{self._piece_id[:8]}").start()
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._keeper is not None:
            self._keeper.stop()


def execute_piece(piece: ClaimedPiece, inputs: SearchInputs, store: ArtifactStore, *, local: Path) -> dict[str, Any]:
    """Train one piece from the state at ``piece.resume_from`` (None: from the start); what it left, as JSON.

    ``{"result": ..., "state": prefix or None, "steps": n}``: the engine's result (without the model),
    where the candidate's state now is (kept when it may train on or be chosen), the steps it trained.
    """
    scratch = local / f"piece-{uuid.uuid4().hex[:12]}"
    spec, resume_from = piece.candidate(), piece.resume_from
    try:
        run = None
        if resume_from is not None:
            run = load_candidate(spec, inputs, fetch_state(store, resume_from, scratch / "from"))
        before = 0 if run is None else run.tuning.step
        result = recover_candidate(spec, inputs, resume=run)
        assert result.run is not None
        state = None
        if result.status in _RESUMABLE:
            save_candidate(result.run, scratch / "to")
            state = (f"{resume_prefix(piece.job_id)}/candidates/{piece.attempt}/"
                     f"{spec.key}-{uuid.uuid4().hex[:12]}")
            for name in CANDIDATE_FILES:
                store.put_file(f"{state}/{name}", scratch / "to" / name, media_type="application/octet-stream")
        return {"result": encode_result(result), "state": state, "steps": result.run.tuning.step - before}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def fetch_state(store: ArtifactStore, prefix: str, directory: Path) -> Path:
    """Download a candidate's state saved under ``prefix`` into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in CANDIDATE_FILES:
        store.download(f"{prefix}/{name}", directory / name)
    return directory


def encode_result(result: CandidateResult) -> dict[str, Any]:
    """A candidate's result as JSON (its model and optimiser stay out); :func:`decode_result` reads it back."""
    return {"spec": result.spec.to_dict(), "status": result.status, "reason": result.reason,
            "curve": [point.to_dict() for point in result.curve], "best": result.best.to_dict(),
            "epochs": result.epochs, "seconds": result.seconds, "drop": result.drop.to_dict()}


def decode_result(data: dict[str, Any]) -> CandidateResult:
    return CandidateResult(spec=CandidateSpec.from_dict(data["spec"]), status=data["status"], reason=data["reason"],
                           curve=tuple(ValidationPoint.from_dict(p) for p in data["curve"]),
                           best=ValidationPoint.from_dict(data["best"]), epochs=float(data["epochs"]),
                           seconds=float(data["seconds"]), drop=DropInterval.from_dict(data["drop"]), run=None)


def _either(*checks: Callable[[], bool]) -> Callable[[], bool]:
    return lambda: any(check() for check in checks)


def _with_cancel(inputs: SearchInputs, cancel: Callable[[], bool]) -> SearchInputs:
    """``inputs`` for one piece: its own stop check, and no per-step progress (the search counts whole pieces)."""
    return dataclasses.replace(inputs, should_cancel=cancel, progress=None, steps_done=None)


# --- a piece's task ------------------------------------------------------------------------------------

#: The search's inputs this process built last: (job id, attempt) -> inputs and their scratch space.
_BUILT: dict[tuple[str, int], tuple[SearchInputs, Path]] = {}
_BUILT_LOCK = threading.Lock()


def run_piece(piece_id: str, context: Any) -> str:
    """Claim the piece ``piece_id`` and train it; ``skipped`` when it cannot be claimed (taken, done, stale).

    A worker told to stop (SIGTERM) gives the piece back to the queue for another worker; one that
    loses the piece's lease (the search took it back, the job was cancelled or ended) drops its work.
    """
    settings = context.settings
    with transaction(context.sessions) as session:
        row = repository.claim_piece(session, piece_id=piece_id, worker_id=context.worker_id, lease_s=settings.lease_s)
        if row is None:
            return "skipped"
        piece = ClaimedPiece.of(row)
        job = repository.get_job(session, job_id=row.job_id)
        assert job is not None  # a piece's job outlives it (the foreign key cascades)
        definition = JobDefinition.of(job)
    with PieceLease(context, piece_id) as lease:
        stopping = _either(lease.lost, lambda: shutdown.requested(settings.resolved_work_dir))
        try:
            inputs = _inputs(context, piece, definition, stopping)
            outcome = execute_piece(piece, _with_cancel(inputs, stopping), context.store,
                                    local=settings.resolved_work_dir / f"{piece.job_id}.pieces")
        except JobCancelledError:
            if not lease.lost():
                with transaction(context.sessions) as session:
                    repository.release_piece(session, piece_id=piece_id, worker_id=context.worker_id)
                return "handed_back"
            return "dropped"
        except Exception:
            # Given back: the search's own worker runs it, and fails the job there if it fails again.
            logger.exception("budget piece %s of job %s failed here; it is given back", piece_id, piece.job_id)
            with transaction(context.sessions) as session:
                repository.release_piece(session, piece_id=piece_id, worker_id=context.worker_id)
            return "failed"
    with transaction(context.sessions) as session:
        kept = repository.finish_piece(session, piece_id=piece_id, worker_id=context.worker_id, result=outcome)
    return "done" if kept else "dropped"


def forget_inputs() -> None:
    """Let go of the search inputs this process built for pieces (before it runs a job of its own)."""
    with _BUILT_LOCK:
        for _inputs_built, scratch in _BUILT.values():
            shutil.rmtree(scratch, ignore_errors=True)
        _BUILT.clear()


def _inputs(context: Any, piece: ClaimedPiece, job: JobDefinition, should_cancel: Callable[[], bool]) -> SearchInputs:
    """The search's inputs of the piece's job attempt, built once per process (the last job's are let go)."""
    with _BUILT_LOCK:
        built = _BUILT.get((piece.job_id, piece.attempt))
        if built is not None:
            return built[0]
        for _old, scratch in _BUILT.values():
            shutil.rmtree(scratch, ignore_errors=True)
        _BUILT.clear()
        settings = context.settings
        scratch = settings.resolved_work_dir / f"{piece.job_id}.pieces-{piece.attempt}"
        shutil.rmtree(scratch, ignore_errors=True)
        config = run_config(job.params, device=settings.device)
        fetched = InputFetcher(settings=settings, sessions=context.sessions, store=context.store,
                               owner_id=job.owner_id, workdir=scratch / "inputs").prepare(
            model=job.model.as_submitted(), dataset=dict(job.dataset.record))
        if Path(fetched.model_ref).is_dir():
            refuse_custom_code(Path(fetched.model_ref))
            check_weight_files(Path(fetched.model_ref))
        # The run's own request (its output directory is never written here) and its resume state, read only.
        inputs = candidate_inputs(
            run_request(job, config, fetched, scratch / "output", settings),
            RunHooks(resume_store=ArtifactResumeStore(context.store, job_id=piece.job_id,
                                                      local=scratch / "checkpoints"),
                     should_cancel=should_cancel))
        _BUILT[(piece.job_id, piece.attempt)] = (inputs, scratch)
        return inputs
