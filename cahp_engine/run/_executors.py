"""Who runs an accuracy budget's candidates: this process one after another, or a pool of workers.

The search (:mod:`cahp_engine.run._budget`) hands a :class:`CandidateExecutor` the pieces of one rung
of successive halving together (:class:`~cahp_engine.run._candidates.CandidateSpec`: which heads, how
far to train) and waits for all of their results. Every piece is deterministic for its spec and the
run's :class:`~cahp_engine.run._candidates.SearchInputs`, and every decision of the search is taken
on a whole rung's results, so the answer does not depend on the executor, on the number of workers or
on the order in which pieces finish.

:class:`InTurn` runs the pieces here, keeping each candidate's recovery in memory between two of its
pieces. An executor that sends pieces to other processes (the job service's worker pool:
:mod:`worker.candidates`) carries a candidate from one piece to the next on disk with
:func:`save_candidate` and :func:`load_candidate`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
from torch import nn

from cahp_engine.errors import PipelineError
from cahp_engine.recovery import TRAINING_FILES, TrainingResult, load_training_state, save_training_state
from cahp_engine.run._candidates import (
    CandidateResult,
    CandidateRun,
    CandidateSpec,
    SearchInputs,
    finish_run,
    recover_candidate,
    start_run,
)

__all__ = ["CANDIDATE_FILES", "CandidateExecutor", "InTurn", "finish_candidate", "load_candidate", "save_candidate"]

#: Beside the fine-tuning's own files: the candidate's bookkeeping and every evaluation's predictions.
CANDIDATE_FILE = "candidate.json"
#: Every file :func:`save_candidate` writes, for a store that carries a candidate between processes.
CANDIDATE_FILES = (*TRAINING_FILES, CANDIDATE_FILE)


class CandidateExecutor(Protocol):
    """Runs the search's pieces of work and keeps each candidate between two of its pieces.

    ``run(pieces, inputs)`` returns one :class:`CandidateResult` per piece, in the pieces' order (its
    ``run`` may be None: the executor keeps the candidate). ``resume(spec, inputs)`` hands back the
    candidate ``spec`` names (its last piece's state), to go on with here. ``release(spec)`` lets a
    candidate go: it will not be resumed.
    """

    def run(self, pieces: Sequence[CandidateSpec], inputs: SearchInputs) -> list[CandidateResult]: ...

    def resume(self, spec: CandidateSpec, inputs: SearchInputs) -> CandidateRun: ...

    def release(self, spec: CandidateSpec) -> None: ...


class InTurn:
    """A :class:`CandidateExecutor` that runs every piece in this process, one after another."""

    def __init__(self) -> None:
        self._runs: dict[str, CandidateRun] = {}

    def run(self, pieces: Sequence[CandidateSpec], inputs: SearchInputs) -> list[CandidateResult]:
        out = []
        for spec in pieces:
            result = recover_candidate(spec, inputs, resume=self._runs.get(spec.key))
            assert result.run is not None
            self._runs[spec.key] = result.run
            out.append(dataclasses.replace(result, run=None))
        return out

    def resume(self, spec: CandidateSpec, inputs: SearchInputs) -> CandidateRun:
        run = self._runs.get(spec.key)
        return run if run is not None else start_run(spec, inputs)

    def release(self, spec: CandidateSpec) -> None:
        self._runs.pop(spec.key, None)


def finish_candidate(finishing: CandidateSpec, spec: CandidateSpec, inputs: SearchInputs,
                     executor: CandidateExecutor) -> tuple[CandidateResult, nn.Module, TrainingResult]:
    """Recover the chosen candidate ``spec`` on from where the search left it, as far as ``finishing`` says.

    The executor lets the candidate go. Returns its last result (without the run, which is finished), the
    model with its best weights, and the record of its whole recovery.
    """
    last = recover_candidate(finishing, inputs, resume=executor.resume(spec, inputs))
    executor.release(spec)
    assert last.run is not None
    model, recovery = finish_run(last.run)
    return dataclasses.replace(last, run=None), model, recovery


def save_candidate(run: CandidateRun, directory: Path) -> None:
    """Write a candidate's recovery so far into ``directory``: :func:`load_candidate` goes on from it.

    The fine-tuning's state (:func:`~cahp_engine.recovery.save_training_state`: weights, AdamW, the
    schedule, the random state, the best weights) and, in :data:`CANDIDATE_FILE`, the seconds spent,
    where it met the budget or why it stopped, and the predictions of every evaluation (the paired
    bootstrap of its drop needs the best one's). No pickle.
    """
    save_training_state(run.tuning.state_dict(), directory)
    meta = {"seconds": run.seconds, "met": run.met, "stopped": run.stopped, "reason": run.reason,
            "predictions": [np.asarray(p).astype(np.int64).tolist() for p in run.scorer.predictions]}
    (directory / CANDIDATE_FILE).write_text(json.dumps(meta), encoding="utf-8")


def load_candidate(spec: CandidateSpec, inputs: SearchInputs, directory: Path) -> CandidateRun:
    """The candidate ``spec`` names, as :func:`save_candidate` left it in ``directory``, on ``inputs``.

    Raises
    ------
    PipelineError
        When the directory does not hold a candidate this release can read.
    """
    run = start_run(spec, inputs)
    try:
        meta = json.loads((directory / CANDIDATE_FILE).read_text(encoding="utf-8"))
        run.tuning.load_state_dict(dict(load_training_state(directory)))
        run.scorer.predictions[:] = [np.asarray(p, dtype=np.int64) for p in meta["predictions"]]
        run.seconds, run.met = float(meta["seconds"]), meta["met"]
        run.stopped, run.reason = meta["stopped"], str(meta["reason"])
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise PipelineError(f"the candidate {spec.key} saved in {directory.name} cannot be read: {exc}") from exc
    return run
