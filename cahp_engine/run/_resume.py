"""Going on where an earlier run of the same job stopped: the stages saved as a run goes, and resuming.

A run given a :class:`ResumeStore` saves, as it goes:

``dense``
    the dense model after dense fine-tuning (its weights and the fine-tuning's record);
``selection``
    the whole :class:`~cahp_engine.selection.SelectionResult` (JSON; arrays with their dtype);
``pruned``
    the pruned model's scores before recovery (its weights are the dense ones cut by the selection,
    which surgery repeats in a second);
``dense_finetune_training`` and ``recovery_training``
    the fine-tuning under way at each of its stops (every epoch's end, or each evaluation), no more
    often than ``interval_s``: weights, AdamW, schedule, random state, losses, best weights so far
    (:meth:`~cahp_engine.recovery.FineTuning.state_dict`); the last stop's state is the finished
    fine-tuning. A run stopped in a fine-tuning because its worker shuts down also saves that
    fine-tuning's state at the last step taken (``save_when_stopped``).

A run given a store that holds some of these starts from the latest: it loads the model and the data
as always, then takes each saved stage instead of computing it again, and says so in its log; a
fine-tuning goes on from its last saved stop and ends as an uninterrupted one would. Every saved stage
carries the run's settings: a store holding another run's stages is not used. An accuracy budget judged
after reconstruction saves each candidate's score as it is made (``budget_scores``), so a resumed search
scores none of them again; the budget's fine-tunings start again. The engine writes no storage of its
own: the caller's store keeps the directories (the job service: the artifact store, removed when the
job ends).

The words: what a run saves for a later run to go on from is its *resume state*, kept in a
:class:`ResumeStore` and driven by a :class:`Resumer`; a *checkpoint* in cahp is only the pruned model's
files (``report.checkpoint``, :func:`~cahp_engine.models.load_pruned`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import shutil
import tempfile
import time
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from safetensors.torch import load_file, save_file
from torch import nn

from cahp_engine.config import PruningConfig
from cahp_engine.data import EncodedDataset, TrainRows
from cahp_engine.errors import JobCancelledError, PipelineError
from cahp_engine.recovery import ClassificationMetrics, FineTuning, load_training_state, save_training_state
from cahp_engine.run import _steps as steps
from cahp_engine.run._live import LiveLog
from cahp_engine.run._report import DenseFinetuneRecord
from cahp_engine.selection import SelectionResult

_STAGE_FILE = "stage.json"
_WEIGHTS_FILE = "weights.safetensors"
_SELECTION_FILE = "selection.json"


class ResumeStore(Protocol):
    """Where a run keeps what it finished, for a later run of the same job to go on from.

    ``save(stage, directory)`` keeps the files of ``directory`` as ``stage``'s saved state, replacing
    an earlier one of that stage, and returns once they are kept (a run killed afterwards finds them).
    ``restore()`` answers every stage kept so far as a local directory holding its files.
    ``discard(stage)`` drops a stage a later one made useless (a fine-tuning's state once its result
    is saved); nothing when there is none.
    """

    def save(self, stage: str, directory: Path) -> None: ...

    def restore(self) -> Mapping[str, Path]: ...

    def discard(self, stage: str) -> None: ...


class DirectoryResumeStore:
    """A :class:`ResumeStore` in a local directory (one subdirectory per stage, replaced whole)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def save(self, stage: str, directory: Path) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        partial = self.root / f".{stage}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(directory, partial)
        shutil.rmtree(self.root / stage, ignore_errors=True)
        partial.rename(self.root / stage)

    def restore(self) -> Mapping[str, Path]:
        if not self.root.is_dir():
            return {}
        return {p.name: p for p in sorted(self.root.iterdir()) if p.is_dir() and not p.name.startswith(".")}

    def discard(self, stage: str) -> None:
        shutil.rmtree(self.root / stage, ignore_errors=True)


@dataclasses.dataclass(frozen=True)
class SavePolicy:
    """When a run's fine-tunings save their state: at their stops, no more often than ``interval_s`` seconds of
    ``clock``, and, when a cancel stops one, if ``when_stopped`` answers True (None: never)."""

    interval_s: float = 0.0
    when_stopped: Callable[[], bool] | None = None
    clock: Callable[[], float] = time.monotonic


class Resumer:
    """One run's side of its resume state: what an earlier run saved, and saving each stage as it ends.

    Without a store it saves nothing and restores nothing; its :class:`LiveLog` still logs the fine-tunings.
    """

    def __init__(self, store: ResumeStore | None, config: PruningConfig, say: Callable[[str], None], *,
                 live: LiveLog, saving: SavePolicy | None = None) -> None:
        self._store, self._say, self._live = store, say, live
        self._settings = _fingerprint(config)
        saving = saving or SavePolicy()
        self._interval, self._clock = saving.interval_s, saving.clock
        self._save_when_stopped = saving.when_stopped
        self._last_save: dict[str, float] = {}
        self._armed: str | None = None
        self._tuning: FineTuning | None = None
        self.saved: dict[str, Path] = dict(store.restore()) if store is not None else {}
        stale = sorted(s for s, d in self.saved.items() if _read_stage(d).get("settings") != self._settings)
        if stale:
            say(f"ignoring the checkpoints {', '.join(stale)}: they were saved by a run with other settings")
            self.saved = {s: d for s, d in self.saved.items() if s not in stale}
        if self.saved:
            say(f"resuming from the checkpoints of an earlier attempt: {', '.join(sorted(self.saved))}")

    # --- the steps, each taken from its saved state or run and saved -----------------------------------

    def dense_finetune(self, run: steps.RunContext, *, model: nn.Module, inputs: steps.Inputs,
                       classifier_trained: bool) -> DenseFinetuneRecord:
        """:func:`steps.dense_finetune`, or its saved result loaded into ``model``."""
        saved = self.saved.get("dense")
        if saved is not None:
            try:
                record = DenseFinetuneRecord.from_dict(_read_stage(saved)["record"])
                model.load_state_dict(load_file(str(saved / _WEIGHTS_FILE)), strict=True)
            except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
                self._unusable("dense", exc)
            else:
                run.overall("dense_finetune", 1.0)
                self._say("dense fine-tuning: the fine-tuned dense model saved by an earlier attempt")
                return record
        with self.training("dense_finetune"):
            record = steps.dense_finetune(run, model=model, inputs=inputs, classifier_trained=classifier_trained)
        if record.ran:
            self._save("dense", record=record.to_dict(),
                       files={_WEIGHTS_FILE: lambda path: save_file(_cpu(model), str(path))})
            if self._store is not None:
                self._store.discard("dense_finetune_training")  # the fine-tuned weights say all it would
        return record

    def select(self, run: steps.RunContext, *, model: nn.Module, train: TrainRows) -> SelectionResult:
        """:func:`steps.select`, or the selection an earlier attempt saved."""
        saved = self.saved.get("selection")
        restored: Any = None
        if saved is not None:
            try:
                restored = decode(SelectionResult, json.loads((saved / _SELECTION_FILE).read_text(encoding="utf-8")))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                self._unusable("selection", exc)
        if restored is not None:
            result = restored
            run.monitor.timings.update(result.timings)
            run.overall("selection", 1.0)
            sel = result.selection
            self._say(f"selection: saved by an earlier attempt; k* = {result.k_star}, keeping {sel.num_kept} of "
                      f"{sel.kept_mask.size} heads")
            return typing.cast(SelectionResult, result)
        result = steps.select(run, model=model, train=train)
        try:
            text = json.dumps(encode(result))
        except TypeError as exc:  # a field of a kind the codec does not know: the next attempt selects again
            self._say(f"the selection is not checkpointed ({exc})")
            return result

        def write(path: Path) -> None:
            path.write_text(text, encoding="utf-8")

        self._save("selection", files={_SELECTION_FILE: write})
        return result

    def evaluate_pruned(self, run: steps.RunContext, *, model: nn.Module,
                        evaluation: EncodedDataset) -> ClassificationMetrics:
        """:func:`steps.evaluate_pruned`, or the scores an earlier attempt saved."""
        saved = self.saved.get("pruned")
        if saved is not None:
            try:
                before = ClassificationMetrics.from_dict(_read_stage(saved)["before"])
            except (ValueError, KeyError, TypeError) as exc:
                self._unusable("pruned", exc)
            else:
                run.overall("pruned_evaluation", 1.0)
                return before
        before = steps.evaluate_pruned(run, model=model, evaluation=evaluation)
        self._save("pruned", before=before.to_dict())
        return before

    # --- the budget's scores (a ScoreBook: cahp_engine.run._scoring) --------------------------------

    def saved_scores(self) -> list[dict[str, Any]]:
        """The candidates an earlier attempt scored after reconstruction (empty when none)."""
        saved = self.saved.get("budget_scores")
        if saved is None:
            return []
        entries = _read_stage(saved).get("scores")
        if not isinstance(entries, list):
            self._unusable("budget_scores", ValueError("no list of scores"))
            return []
        self._say(f"budget: {len(entries)} candidate(s) scored by an earlier attempt are not scored again")
        return entries

    def save_scores(self, entries: list[dict[str, Any]]) -> None:
        """Keep every candidate scored so far, for a later attempt."""
        self._save("budget_scores", scores=entries)

    # --- fine-tunings ------------------------------------------------------------------------------

    @contextmanager
    def training(self, stage: str) -> Iterator[None]:
        """While open, the fine-tuning of ``stage`` resumes from its saved state and saves its stops.

        Stopped between two steps (:class:`~cahp_engine.errors.JobCancelledError`) while
        ``save_when_stopped()`` answers True (the job service: the worker is shutting down and hands
        the job back), it saves the state of the last step taken first, so the next attempt loses nothing.
        """
        self._armed, self._tuning = stage, None
        try:
            yield
        except JobCancelledError:
            tuning = self._tuning
            if (self._store is not None and tuning is not None and tuning.step > 0 and not tuning.done
                    and self._save_when_stopped is not None and self._save_when_stopped()):
                self._save_training(f"{stage}_training", tuning)
                self._say(f"{stage}: stopped at step {tuning.step}; its state is saved for the next attempt")
            raise
        finally:
            self._armed, self._tuning = None, None

    def resume(self, stage: str) -> Mapping[str, Any] | None:
        """The saved state of ``stage``'s fine-tuning to go on from, when it is the one under way."""
        saved = self.saved.get(f"{stage}_training")
        if stage != self._armed or saved is None:
            return None
        try:
            state = load_training_state(saved)
        except PipelineError as exc:
            self._unusable(f"{stage}_training", exc)
            return None
        self._say(f"{stage}: going on from step {state['step']} (saved by an earlier attempt)")
        return state

    def on_stop(self, stage: str) -> Callable[[FineTuning], None]:
        """What ``stage``'s fine-tuning calls at each stop: the live log watches it; its state is saved."""

        def stopped(tuning: FineTuning) -> None:
            self._live.watch(stage, tuning)
            if stage == self._armed:
                self._tuning = tuning
            if stage != self._armed or self._store is None or tuning.step == 0:
                return
            name = f"{stage}_training"
            now = self._clock()
            if not tuning.done and now - self._last_save.get(name, float("-inf")) < self._interval:
                return
            self._last_save[name] = now
            self._save_training(name, tuning)

        return stopped

    # --- plumbing ----------------------------------------------------------------------------------

    def _save_training(self, name: str, tuning: FineTuning) -> None:
        state = tuning.state_dict()
        self._save(name, step=tuning.step, files={"": lambda directory: save_training_state(state, directory)})

    def _unusable(self, stage: str, exc: Exception) -> None:
        """A saved stage that cannot be read (another release wrote it, a file is damaged): run it again."""
        self._say(f"the checkpoint {stage} cannot be used ({type(exc).__name__}: {exc}); that stage runs again")
        self.saved.pop(stage, None)

    def _save(self, stage: str, *, files: Mapping[str, Callable[[Path], None]] | None = None, **meta: Any) -> None:
        if self._store is None:
            return
        with tempfile.TemporaryDirectory(prefix="cahp-checkpoint-") as tmp:
            directory = Path(tmp) / stage
            directory.mkdir()
            for name, write in (files or {}).items():
                write(directory / name if name else directory)
            (directory / _STAGE_FILE).write_text(json.dumps({"settings": self._settings, **meta}), encoding="utf-8")
            self._store.save(stage, directory)


#: The stages in the order a run reaches them: the last one restored is where a resumed run goes on from.
_RUN_ORDER = ("dense_finetune_training", "dense", "selection", "budget_scores", "pruned", "recovery_training")


def resume_point(restored: Mapping[str, Path]) -> str | None:
    """Where a run given these restored stages goes on from, in words; None when from the start.

    Parameters
    ----------
    restored : mapping of str to Path
        A :class:`ResumeStore`'s ``restore()``: stage name -> its directory.

    Returns
    -------
    str or None
        The latest stage saved (``"selection"``), with the step for a fine-tuning under way
        (``"recovery_training step 63"``).
    """
    reached = [stage for stage in _RUN_ORDER if stage in restored]
    if not reached:
        return None
    stage = reached[-1]
    step = _read_stage(Path(restored[stage])).get("step")
    return f"{stage} step {step}" if isinstance(step, int) else stage


def _fingerprint(config: PruningConfig) -> dict[str, Any]:
    """The settings a saved stage must share with the run using it (``device`` may differ between attempts)."""
    return json.loads(json.dumps({k: v for k, v in config.to_dict().items() if k != "device"}))


def _read_stage(directory: Path) -> dict[str, Any]:
    try:
        data = json.loads((directory / _STAGE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _cpu(model: nn.Module) -> dict[str, Any]:
    return {name: tensor.detach().to("cpu", copy=True).contiguous() for name, tensor in model.state_dict().items()}


# --- a typed JSON codec for the selection's records (no pickle) ------------------------------------


def encode(value: Any) -> Any:
    """``value`` as JSON: dataclasses by field, arrays with dtype and shape, mappings as ``[key, value]`` pairs.

    Raises
    ------
    TypeError
        For a value of another kind.
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
    if isinstance(value, np.ndarray):
        return {"dtype": str(value.dtype), "shape": list(value.shape), "data": value.ravel().tolist()}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return [[encode(k), encode(v)] for k, v in value.items()]
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"cannot write a {type(value).__name__} as JSON")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def decode(hint: Any, value: Any) -> Any:
    """Rebuild a value of type ``hint`` from :func:`encode`'s JSON (ValueError when it does not fit)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        for arg in sorted(args, key=lambda a: a is not type(None)):
            try:
                return decode(arg, value)
            except (ValueError, TypeError, KeyError):
                continue
        raise ValueError(f"{value!r:.60} fits none of {hint}")
    if hint is type(None):
        if value is not None:
            raise ValueError("not null")
        return None
    if hint is Any:
        return value
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        if not isinstance(value, dict):
            raise ValueError(f"{hint.__name__} is read from an object")
        hints = _hints(hint)
        return hint(**{f.name: decode(hints[f.name], value[f.name])
                       for f in dataclasses.fields(hint) if f.init and f.name in value})
    if hint is np.ndarray:
        if not isinstance(value, dict) or "dtype" not in value:
            raise ValueError("an array is read from an object with its dtype")
        return np.asarray(value["data"], dtype=np.dtype(value["dtype"])).reshape(value["shape"])
    if origin in (dict, Mapping) or (isinstance(origin, type) and issubclass(origin, Mapping)):
        key, item = args
        return {decode(key, k): decode(item, v) for k, v in value}
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(decode(args[0], v) for v in value)
        return tuple(decode(a, v) for a, v in zip(args, value, strict=True))
    if origin is list:
        return [decode(args[0], v) for v in value]
    if origin is typing.Literal:
        if value not in args:
            raise ValueError(f"{value!r} is not one of {args}")
        return value
    if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(hint, type) and not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        raise ValueError(f"{value!r:.60} is not a {getattr(hint, '__name__', hint)}")
    return value
