"""Request and response bodies: ``...Create`` for input, ``...Public`` for output.

Input models forbid unknown fields, so a misspelt option is a 422 rather than silently ignored.
``JobParams`` is derived from :class:`cahp_engine.config.PruningConfig` and only checks types; the
ranges are checked by ``PruningConfig`` itself, so the API and ``cahp prune`` give the same messages.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, get_args, get_origin, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator

from app.core.labels import MAX_LABELS, check_labels
from app.core.models import JobStatus
from app.core.params import SERVICE_ONLY_PARAMS
from cahp_engine.config import PruningConfig
from cahp_engine.data import DatasetOptions
from cahp_engine.run import RunSummary

T = TypeVar("T")


class _Input(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelSpec(_Input):
    uri: str = Field(
        min_length=1, max_length=2048,
        description="hf://org/name, file:///path, upload://id or s3://bucket/key",
        examples=["hf://prajjwal1/bert-tiny", "upload://3f2c..."],
    )
    revision: str | None = Field(
        default=None, max_length=255,
        description="Hub revision (hf:// only): a branch, tag or commit name (git's rules: no `..`, no empty or "
        "`.`-led component)",
    )


def _dataset_spec_model() -> type[BaseModel]:
    """``DatasetSpec``: the dataset's URIs plus every :class:`DatasetOptions` field, with its default.

    Built from the dataclass, like ``JobParams``, so an option the engine adds is accepted here too.
    """
    hints = get_type_hints(DatasetOptions)
    options: dict[str, Any] = {
        f.name: (hints[f.name], Field(default=f.default, min_length=1, max_length=200))
        for f in dataclasses.fields(DatasetOptions)
    }
    return create_model(
        "DatasetSpec",
        __base__=_Input,
        __doc__="The dataset: where it is, and which of its columns and splits to use.",
        uri=(str, Field(
            min_length=1, max_length=2048,
            description="hf://datasets/org/name, file:///dir, upload://id or s3://bucket/key; a directory or "
            "archive of {split}.csv/.jsonl/.parquet files, or a single split file (then give eval_uri)",
        )),
        eval_uri=(str | None, Field(
            default=None, max_length=2048,
            description="A second single file holding the evaluation split, when `uri` is a single file",
        )),
        **options,
    )


if TYPE_CHECKING:

    class DatasetSpec(_Input):
        uri: str
        eval_uri: str | None

else:
    DatasetSpec = _dataset_spec_model()


def _params_model() -> type[BaseModel]:
    """``JobParams``: every PruningConfig field but ``device``, each optional, types only.

    Built from the dataclass so the API accepts exactly what ``cahp prune`` does as the engine grows.
    """
    hints = get_type_hints(PruningConfig)
    fields: dict[str, Any] = {
        f.name: (_json_type(hints[f.name]) | None, Field(default=None))
        for f in dataclasses.fields(PruningConfig)
        if f.name not in SERVICE_ONLY_PARAMS
    }
    return create_model(
        "JobParams",
        __config__=ConfigDict(extra="forbid", strict=True),
        __doc__="Pruning settings, the same as the `cahp prune` options; unset ones take the engine's "
        "defaults and ranges are checked as `cahp prune` checks them.",
        **fields,
    )


def _json_type(hint: Any) -> Any:
    # JSON has arrays, not tuples; PruningConfig.from_dict turns the lists back into tuples.
    if get_origin(hint) is tuple:
        return list[get_args(hint)[0]]  # type: ignore[misc]
    return hint


if TYPE_CHECKING:

    class JobParams(BaseModel):
        pass

else:
    JobParams = _params_model()


def given_params(params: BaseModel) -> dict[str, Any]:
    """The settings the client set to a value (``null`` means "the default" for every one)."""
    return {k: v for k, v in params.model_dump(exclude_unset=True).items() if v is not None}


class JobCreate(_Input):
    model: ModelSpec
    dataset: DatasetSpec
    params: JobParams = Field(default_factory=JobParams)
    labels: dict[str, str] = Field(
        default_factory=dict, max_length=MAX_LABELS,
        description=f"Your metadata, e.g. commit, branch, model name: at most {MAX_LABELS} labels; keys 1-63 "
        "letters, digits, `._/-`; values up to 255 characters. Filter the list with `?label=key:value`.",
        examples=[{"git/commit": "4f2c9e1", "branch": "main"}],
    )
    notify_url: str | None = Field(
        default=None, max_length=2048,
        description="Also deliver this job's events here (Standard Webhooks, signed with the secret from "
        "GET /v1/webhooks/default/secret)",
    )

    @field_validator("labels")
    @classmethod
    def _check_labels(cls, value: dict[str, str]) -> dict[str, str]:
        return check_labels(value)


class JobError(BaseModel):
    code: str
    message: str


def _result_model() -> type[BaseModel]:
    """``JobResult``: the engine's :class:`RunSummary`, every field nullable (rows from older releases)."""
    hints = get_type_hints(RunSummary)
    fields: dict[str, Any] = {f.name: (hints[f.name] | None, None) for f in dataclasses.fields(RunSummary)}
    return create_model("JobResult", __doc__="The headline figures of a succeeded job (report.json's `summary`).",
                        **fields)


if TYPE_CHECKING:

    class JobResult(BaseModel):
        pass

else:
    JobResult = _result_model()


class JobLinks(BaseModel):
    self: str
    logs: str
    artifacts: str
    cancel: str
    events: str
    deliveries: str


class JobPublic(BaseModel):
    id: str
    status: JobStatus
    stage: str | None
    progress: float = Field(ge=0, le=1)
    cancel_requested: bool
    model: ModelSpec
    dataset: DatasetSpec
    params: dict[str, Any] = Field(description="The full effective pruning settings")
    created_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    error: JobError | None
    result: JobResult | None
    labels: dict[str, str]
    notify_url: str | None
    artifacts_expired: bool = Field(description="The retention sweep removed the artifacts (routes answer 410)")
    links: JobLinks


class Page(BaseModel, Generic[T]):
    data: list[T]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last page")


class LogLine(BaseModel):
    offset: int
    time: dt.datetime
    message: str


class LogPage(BaseModel):
    data: list[LogLine]
    next_offset: int = Field(description="Pass as `offset` to read the lines written after these")


class ArtifactPublic(BaseModel):
    name: str
    size: int
    sha256: str
    media_type: str
    url: str


class WebhookCreate(_Input):
    url: str = Field(min_length=1, max_length=2048, description="An http(s) URL that accepts POSTs")
    events: list[Literal["job.succeeded", "job.failed", "job.cancelled", "job.stage_changed"]] = Field(
        default_factory=list, max_length=4, description="Event types to deliver; empty means all")


class WebhookPublic(BaseModel):
    id: str
    url: str
    events: list[str]
    created_at: dt.datetime


class WebhookCreated(WebhookPublic):
    secret: str = Field(description="Standard Webhooks signing secret (`whsec_...`); shown only in this answer")


class WebhookSecret(BaseModel):
    secret: str = Field(description="Signs deliveries to jobs' own `notify_url` (`whsec_...`)")


class DeliveryAttempt(BaseModel):
    time: dt.datetime
    delivered: bool = Field(description="Whether the receiver answered 2xx")
    status_code: int | None = Field(description="The receiver's HTTP status; null when no answer was received")


class DeliveryPublic(BaseModel):
    id: int
    webhook_id: str = Field(description="The `webhook-id` header: the same on every attempt")
    event: str
    url: str
    endpoint_id: str | None = Field(description="The registered endpoint; null for the job's notify_url")
    status: Literal["pending", "delivered", "failed"]
    created_at: dt.datetime
    next_attempt_at: dt.datetime | None
    delivered_at: dt.datetime | None
    attempts: list[DeliveryAttempt]


class UploadPublic(BaseModel):
    id: str
    uri: str
    kind: Literal["archive", "data"]
    filename: str
    size: int
    sha256: str
    media_type: str
    created_at: dt.datetime


class Readiness(BaseModel):
    status: Literal["ok"]
    database: Literal["ok"]
    broker: Literal["ok"]


class Health(BaseModel):
    status: Literal["ok"]


class Problem(BaseModel):
    """An error, as ``application/problem+json`` (RFC 9457) with a stable ``code``."""

    model_config = ConfigDict(extra="allow")

    type: str
    title: str
    status: int
    detail: str
    code: str
