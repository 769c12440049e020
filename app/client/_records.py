"""The API's answers as small frozen records, built from their JSON.

Each record holds the fields of its schema in ``/openapi.json`` that a caller acts on (a test checks
them against the real app's schemas: ``JobPublic``, ``ArtifactPublic``, ``UploadPublic``,
``LogLine``, ``Page[...]``). Fields the client does not know are ignored, so a newer server's answers
still build; a field the client needs that is missing or of the wrong JSON type is an
:class:`InvalidResponseError`. A missing optional field takes its default, so an older server's
answers build too.

``Job``, ``Artifact`` and ``Upload`` also keep the answer as sent in ``raw`` (read-only, left out of
comparisons): ``cahp ... --json`` prints it, every field included. Code reads the attributes.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from app.client._exceptions import InvalidResponseError

__all__ = ["TERMINAL", "Artifact", "Attempt", "DatasetSpec", "Job", "JobError", "JobResult", "LogLine", "ModelSpec",
           "Page", "Upload"]

#: The statuses a job does not leave.
TERMINAL = ("succeeded", "failed", "cancelled")

T = TypeVar("T")
_REQUIRED: Any = object()


def _empty() -> Mapping[str, Any]:
    return MappingProxyType({})


def _object(data: object, record: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise InvalidResponseError(f"{record}: expected a JSON object, got {type(data).__name__}")
    return data


def _field(data: Mapping[str, Any], name: str, record: str, convert: Callable[[Any], T], default: Any) -> Any:
    """``convert(data[name])``; ``default`` when it is absent or null; InvalidResponseError if required."""
    value = data.get(name)
    if value is None:
        if default is _REQUIRED:
            raise InvalidResponseError(f"{record}: the answer has no `{name}`")
        return default
    try:
        return convert(value)
    except (TypeError, ValueError) as exc:
        raise InvalidResponseError(f"{record}: `{name}` is not what the API documents: {exc}") from exc


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def _integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    return value


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {type(value).__name__}")
    return float(value)


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected true or false, got {type(value).__name__}")
    return value


def _time(value: Any) -> dt.datetime:
    return dt.datetime.fromisoformat(_text(value))  # ISO 8601 with "Z" or an offset (Python 3.11)


def _labels(value: Any) -> Mapping[str, str]:
    if not isinstance(value, Mapping):
        raise TypeError(f"expected an object, got {type(value).__name__}")
    return MappingProxyType({_text(k): _text(v) for k, v in value.items()})


@dataclasses.dataclass(frozen=True, kw_only=True)
class JobError:
    """Why a job failed: a stable ``code`` and a message for people."""

    code: str
    message: str

    @classmethod
    def from_json(cls, data: object) -> JobError:
        d = _object(data, "JobError")
        return cls(code=_field(d, "code", "JobError", _text, _REQUIRED),
                   message=_field(d, "message", "JobError", _text, ""))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Attempt:
    """One attempt at a job (``AttemptPublic``): its worker, its start and end, why it ended
    (``completed``, ``failed``, ``cancelled``, ``handed_back``, ``lost``; None while it runs) and the
    saved step it resumed from (None: from the start)."""

    number: int
    worker: str
    started_at: dt.datetime | None = None
    ended_at: dt.datetime | None = None
    end: str | None = None
    resumed_from: str | None = None

    @classmethod
    def from_json(cls, data: object) -> Attempt:
        d = _object(data, "Attempt")
        return cls(number=_field(d, "number", "Attempt", _integer, _REQUIRED),
                   worker=_field(d, "worker", "Attempt", _text, _REQUIRED),
                   started_at=_field(d, "started_at", "Attempt", _time, None),
                   ended_at=_field(d, "ended_at", "Attempt", _time, None),
                   end=_field(d, "end", "Attempt", _text, None),
                   resumed_from=_field(d, "resumed_from", "Attempt", _text, None))


@dataclasses.dataclass(frozen=True, kw_only=True)
class JobResult:
    """The headline figures of a succeeded job (each None where the run did not measure it): the engine's
    ``RunSummary`` field for field, as the API's ``JobResult`` is (a test keeps the three equal)."""

    k_star: int | None = None
    heads_total: int | None = None
    heads_kept: int | None = None
    retention: float | None = None
    dense_accuracy: float | None = None
    pruned_accuracy: float | None = None
    speedup: float | None = None
    onnx_max_abs_diff: float | None = None
    onnx_speedup: float | None = None
    int8_accuracy: float | None = None
    int8_speedup: float | None = None
    #: The dense model by name (hub id, its checkpoint's ``_name_or_path``, or the upload's name).
    base_model: str | None = None
    #: The dataset by name.
    dataset: str | None = None
    dense_macro_f1: float | None = None
    pruned_macro_f1: float | None = None
    onnx_accuracy: float | None = None
    onnx_macro_f1: float | None = None
    int8_macro_f1: float | None = None
    int8_max_abs_diff: float | None = None
    #: 95 % intervals of the speed-ups (an interval holding 1 is no measurable change).
    speedup_low: float | None = None
    speedup_high: float | None = None
    onnx_speedup_low: float | None = None
    onnx_speedup_high: float | None = None
    int8_speedup_low: float | None = None
    int8_speedup_high: float | None = None
    #: Every warning of the run, quality warnings (a class never predicted, near chance, too large a drop) first.
    warnings: tuple[str, ...] | None = None
    #: A stable code for each warning, in the same order (``class_lost``, ``near_chance``...).
    warning_codes: tuple[str, ...] | None = None

    @classmethod
    def from_json(cls, data: object) -> JobResult:
        d = _object(data, "JobResult")
        counts, texts = {"k_star", "heads_total", "heads_kept"}, {"base_model", "dataset"}

        def convert(name: str) -> Callable[[Any], Any]:
            if name in ("warnings", "warning_codes"):
                return lambda value: tuple(_text(v) for v in value)
            return _integer if name in counts else _text if name in texts else _number

        return cls(**{f.name: _field(d, f.name, "JobResult", convert(f.name), f.default)
                      for f in dataclasses.fields(cls)})


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Where a job's model comes from."""

    uri: str
    revision: str | None = None

    @classmethod
    def from_json(cls, data: object) -> ModelSpec:
        d = _object(data, "ModelSpec")
        return cls(uri=_field(d, "uri", "ModelSpec", _text, _REQUIRED),
                   revision=_field(d, "revision", "ModelSpec", _text, None))


@dataclasses.dataclass(frozen=True, kw_only=True)
class DatasetSpec:
    """Where a job's dataset comes from (its column and split options are in the job's ``raw``)."""

    uri: str
    eval_uri: str | None = None

    @classmethod
    def from_json(cls, data: object) -> DatasetSpec:
        d = _object(data, "DatasetSpec")
        return cls(uri=_field(d, "uri", "DatasetSpec", _text, _REQUIRED),
                   eval_uri=_field(d, "eval_uri", "DatasetSpec", _text, None))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Job:
    """A job as ``GET /v1/jobs/{id}`` answers it (``JobPublic``)."""

    id: str
    status: str
    stage: str | None = None
    progress: float = 0.0
    #: Seconds the running attempt still needs by its pace so far (None: not known yet, or not running).
    eta_s: float | None = None
    cancel_requested: bool = False
    model: ModelSpec | None = None
    dataset: DatasetSpec | None = None
    created_at: dt.datetime | None = None
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    error: JobError | None = None
    result: JobResult | None = None
    labels: Mapping[str, str] = dataclasses.field(default_factory=_empty)
    notify_url: str | None = None
    artifacts_expired: bool = False
    #: The name given at submit, and the model by name (the base model's, once known).
    name: str | None = None
    model_name: str | None = None
    #: Every attempt so far, oldest first (``started_at`` is the first one's).
    attempts: tuple[Attempt, ...] = ()
    raw: Mapping[str, Any] = dataclasses.field(default_factory=_empty, repr=False, compare=False)

    @property
    def finished(self) -> bool:
        """Whether the job has reached a status it does not leave."""
        return self.status in TERMINAL

    @classmethod
    def from_json(cls, data: object) -> Job:
        d = _object(data, "Job")

        def get(name: str, convert: Callable[[Any], Any], default: Any = None) -> Any:
            return _field(d, name, "Job", convert, default)

        return cls(
            id=get("id", _text, _REQUIRED), status=get("status", _text, _REQUIRED), stage=get("stage", _text),
            progress=get("progress", _number, 0.0), eta_s=get("eta_s", _number),
            cancel_requested=get("cancel_requested", _flag, False),
            model=get("model", ModelSpec.from_json), dataset=get("dataset", DatasetSpec.from_json),
            created_at=get("created_at", _time), started_at=get("started_at", _time),
            finished_at=get("finished_at", _time), error=get("error", JobError.from_json),
            result=get("result", JobResult.from_json), labels=get("labels", _labels, _empty()),
            notify_url=get("notify_url", _text), artifacts_expired=get("artifacts_expired", _flag, False),
            name=get("name", _text), model_name=get("model_name", _text),
            attempts=tuple(Attempt.from_json(a) for a in get("attempts", _items, [])),
            raw=MappingProxyType(dict(d)),
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Artifact:
    """One entry of a job's artifact manifest (``ArtifactPublic``)."""

    name: str
    size: int
    sha256: str
    media_type: str = "application/octet-stream"
    url: str | None = None
    raw: Mapping[str, Any] = dataclasses.field(default_factory=_empty, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: object) -> Artifact:
        d = _object(data, "Artifact")
        return cls(name=_field(d, "name", "Artifact", _text, _REQUIRED),
                   size=_field(d, "size", "Artifact", _integer, _REQUIRED),
                   sha256=_field(d, "sha256", "Artifact", _text, _REQUIRED),
                   media_type=_field(d, "media_type", "Artifact", _text, "application/octet-stream"),
                   url=_field(d, "url", "Artifact", _text, None), raw=MappingProxyType(dict(d)))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Upload:
    """A stored upload (``UploadPublic``); a job refers to it by ``uri`` (``upload://<id>``)."""

    id: str
    uri: str
    kind: str | None = None
    filename: str | None = None
    size: int | None = None
    sha256: str | None = None
    media_type: str | None = None
    created_at: dt.datetime | None = None
    raw: Mapping[str, Any] = dataclasses.field(default_factory=_empty, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: object) -> Upload:
        d = _object(data, "Upload")

        def get(name: str, convert: Callable[[Any], Any], default: Any = None) -> Any:
            return _field(d, name, "Upload", convert, default)

        return cls(id=get("id", _text, _REQUIRED), uri=get("uri", _text, _REQUIRED), kind=get("kind", _text),
                   filename=get("filename", _text), size=get("size", _integer), sha256=get("sha256", _text),
                   media_type=get("media_type", _text), created_at=get("created_at", _time),
                   raw=MappingProxyType(dict(d)))


@dataclasses.dataclass(frozen=True, kw_only=True)
class LogLine:
    """One line of a job's log, as the event stream's ``log`` events carry it."""

    offset: int
    message: str
    time: dt.datetime | None = None

    @classmethod
    def from_json(cls, data: object) -> LogLine:
        d = _object(data, "LogLine")
        return cls(offset=_field(d, "offset", "LogLine", _integer, _REQUIRED),
                   message=_field(d, "message", "LogLine", _text, _REQUIRED),
                   time=_field(d, "time", "LogLine", _time, None))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Page(Generic[T]):
    """One page of a list: its items, and the cursor of the next page (None on the last)."""

    data: tuple[T, ...]
    next_cursor: str | None = None

    @classmethod
    def from_json(cls, data: object, item: Callable[[object], T]) -> Page[T]:
        d = _object(data, "Page")
        items = _field(d, "data", "Page", _items, _REQUIRED)
        return cls(data=tuple(item(entry) for entry in items),
                   next_cursor=_field(d, "next_cursor", "Page", _text, None))


def _items(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(f"expected an array, got {type(value).__name__}")
    return value


@dataclasses.dataclass(frozen=True, kw_only=True)
class Registration:
    """Where a job's model went in the MLflow registry (``RegistrationPublic``)."""

    status: str
    model_name: str
    version: str | None = None
    run_id: str | None = None
    model_uri: str | None = None
    tracking_uri: str | None = None
    error: str | None = None
    raw: Mapping[str, Any] = dataclasses.field(default_factory=_empty, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: object) -> Registration:
        d = _object(data, "Registration")

        def get(name: str, default: Any = None) -> Any:
            return _field(d, name, "Registration", _text, default)

        return cls(status=get("status", _REQUIRED), model_name=get("model_name", _REQUIRED), version=get("version"),
                   run_id=get("run_id"), model_uri=get("model_uri"), tracking_uri=get("tracking_uri"),
                   error=get("error"), raw=MappingProxyType(dict(d)))


@dataclasses.dataclass(frozen=True, kw_only=True)
class JobCheck:
    """What ``POST /v1/jobs/check`` checked of a job without queuing it (``JobCheck``)."""

    checked: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    raw: Mapping[str, Any] = dataclasses.field(default_factory=_empty, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: object) -> JobCheck:
        d = _object(data, "JobCheck")

        def lines(name: str) -> tuple[str, ...]:
            return tuple(_text(v) for v in _field(d, name, "JobCheck", _items, []))

        return cls(checked=lines("checked"), skipped=lines("skipped"), raw=MappingProxyType(dict(d)))
