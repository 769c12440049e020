"""The API's answers as small frozen records, built from their JSON.

Each record holds the fields of its schema in ``/openapi.json`` that a caller acts on (a test checks them
against the real app's schemas: ``JobPublic``, ``ArtifactPublic``, ``UploadPublic``, ``LogLine``,
``Page[...]``). The records have names of their own, so that no class name means two things in this
repository: ``JobFailure`` reads the schema ``JobError``, ``ModelRef`` and ``DatasetRef`` read ``ModelSpec``
and ``DatasetSpec``, ``ArtifactEntry`` ``ArtifactPublic``, ``UploadReceipt`` ``UploadPublic``, ``LogEntry``
``LogLine``, ``ListPage`` ``Page[...]``, ``CheckReport`` ``JobCheck``. Fields the client does not know are
ignored, so a newer server's answers still build; a field the client needs that is missing or of the wrong
JSON type is an :class:`InvalidResponseError`. A missing optional field takes its default, so an older
server's answers build too.

``JobSnapshot``, ``ArtifactEntry``, ``UploadReceipt``, ``Registration`` and ``CheckReport`` also keep the answer
as sent in ``raw`` (read-only, left out of comparisons): ``cahp ... --json`` prints it, every field included.
Code reads the attributes.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import types
import typing
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Generic, Self, TypeVar

from app.client._exceptions import InvalidResponseError

__all__ = ["TERMINAL", "ArtifactEntry", "Attempt", "CheckReport", "DatasetRef", "JobFailure", "JobResult",
           "JobSnapshot", "ListPage", "LogEntry", "ModelRef", "Registration", "UploadReceipt"]

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


def _items(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(f"expected an array, got {type(value).__name__}")
    return value


def _texts(value: Any) -> tuple[str, ...]:
    return tuple(_text(v) for v in _items(value))


#: How a field of each type is read from its JSON (``X | None`` as ``X``; a record by its ``from_json``).
_READERS: dict[Any, Callable[[Any], Any]] = {
    str: _text, int: _integer, float: _number, bool: _flag, dt.datetime: _time, Mapping[str, str]: _labels,
    tuple[str, ...]: _texts,
}


def _reader(hint: Any) -> Callable[[Any], Any]:
    options = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (types.UnionType, typing.Union) and len(options) == 1:
        return _reader(options[0])
    if hint in _READERS:
        return _READERS[hint]
    if typing.get_origin(hint) is tuple and len(options) == 2 and options[1] is Ellipsis:
        item = _reader(options[0])  # a list of records (``attempts``)
        return lambda value: tuple(item(v) for v in _items(value))
    from_json: Callable[[Any], Any] = hint.from_json  # a record: a field of another type fails on first use
    return from_json


R = TypeVar("R")


def _read(cls: type[R], data: object) -> R:
    """A record of ``cls`` from its JSON: each field read by its type, its default when absent or null (a field
    without one is required); ``raw`` keeps the answer as sent."""
    record = cls.__name__
    d = _object(data, record)
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name == "raw":
            values["raw"] = MappingProxyType(dict(d))
            continue
        default = (f.default if f.default is not dataclasses.MISSING
                   else f.default_factory() if f.default_factory is not dataclasses.MISSING else _REQUIRED)
        values[f.name] = _field(d, f.name, record, _reader(hints[f.name]), default)
    return cls(**values)


class _Record:
    """A record the API sends: :meth:`from_json` reads each dataclass field by its type."""

    @classmethod
    def from_json(cls, data: object) -> Self:
        return _read(cls, data)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Answer(_Record):
    """A record that also keeps the answer as sent (read-only, left out of ``repr`` and comparisons)."""

    raw: Mapping[str, Any] = dataclasses.field(default_factory=_empty, repr=False, compare=False)


@dataclasses.dataclass(frozen=True, kw_only=True)
class JobFailure(_Record):
    """Why a job failed: a stable ``code`` and a message for people."""

    code: str
    message: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Attempt(_Record):
    """One attempt at a job (``AttemptPublic``): its worker, its start and end, why it ended
    (``completed``, ``failed``, ``cancelled``, ``handed_back``, ``lost``; None while it runs) and the
    saved step it resumed from (None: from the start)."""

    number: int
    worker: str
    started_at: dt.datetime | None = None
    ended_at: dt.datetime | None = None
    end: str | None = None
    resumed_from: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class JobResult(_Record):
    """The headline figures of a succeeded job (each None where the run did not measure it): the API's
    ``JobResult`` (built from the engine's ``RunSummary``) field for field, in its order; the client imports
    neither, so a test reads the real app's /openapi.json and keeps the fields equal."""

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


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelRef(_Record):
    """Where a job's model comes from."""

    uri: str
    revision: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class DatasetRef(_Record):
    """Where a job's dataset comes from (its column and split options are in the job's ``raw``)."""

    uri: str
    eval_uri: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class JobSnapshot(_Answer):
    """A job as ``GET /v1/jobs/{id}`` answers it (``JobPublic``)."""

    id: str
    status: str
    stage: str | None = None
    progress: float = 0.0
    #: Seconds the running attempt still needs by its pace so far (None: not known yet, or not running).
    eta_s: float | None = None
    cancel_requested: bool = False
    model: ModelRef | None = None
    dataset: DatasetRef | None = None
    created_at: dt.datetime | None = None
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    error: JobFailure | None = None
    result: JobResult | None = None
    labels: Mapping[str, str] = dataclasses.field(default_factory=_empty)
    notify_url: str | None = None
    artifacts_expired: bool = False
    #: The name given at submit, and the model by name (the base model's, once known).
    name: str | None = None
    model_name: str | None = None
    #: Every attempt so far, oldest first (``started_at`` is the first one's).
    attempts: tuple[Attempt, ...] = ()

    @property
    def finished(self) -> bool:
        """Whether the job has reached a status it does not leave."""
        return self.status in TERMINAL


@dataclasses.dataclass(frozen=True, kw_only=True)
class ArtifactEntry(_Answer):
    """One entry of a job's artifact manifest (``ArtifactPublic``)."""

    name: str
    size: int
    sha256: str
    media_type: str = "application/octet-stream"
    url: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class UploadReceipt(_Answer):
    """A stored upload (``UploadPublic``); a job refers to it by ``uri`` (``upload://<id>``)."""

    id: str
    uri: str
    kind: str | None = None
    filename: str | None = None
    size: int | None = None
    sha256: str | None = None
    media_type: str | None = None
    created_at: dt.datetime | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class LogEntry(_Record):
    """One line of a job's log, as the event stream's ``log`` events carry it."""

    offset: int
    message: str
    time: dt.datetime | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class ListPage(Generic[T]):
    """One page of a list: its items, and the cursor of the next page (None on the last)."""

    data: tuple[T, ...]
    next_cursor: str | None = None

    @classmethod
    def from_json(cls, data: object, item: Callable[[object], T]) -> ListPage[T]:
        d = _object(data, "Page")
        items = _field(d, "data", "Page", _items, _REQUIRED)
        return cls(data=tuple(item(entry) for entry in items),
                   next_cursor=_field(d, "next_cursor", "Page", _text, None))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Registration(_Answer):
    """Where a job's model went in the MLflow registry (``RegistrationPublic``)."""

    status: str
    model_name: str
    version: str | None = None
    run_id: str | None = None
    model_uri: str | None = None
    tracking_uri: str | None = None
    error: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckReport(_Answer):
    """What ``POST /v1/jobs/check`` checked of a job without queuing it (``CheckReport``)."""

    checked: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()

