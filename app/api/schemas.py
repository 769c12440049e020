"""Request and response bodies: ``...Create`` for input, ``...Public`` for output.

Input models forbid unknown fields, so a misspelt option is a 422 rather than silently ignored.
``JobParams`` lists the engine's job settings (:data:`cahp_engine.config.SETTINGS`, the ones for the
API), each described and bounded in the OpenAPI schema from its declaration (:func:`param_field`).
Pydantic checks their types only; the ranges are checked by ``PruningConfig`` itself, so the API and
``cahp prune`` give the same messages. No setting is listed by hand, so one the engine adds cannot be left
out. What a job made
(``JobResult``, ``JobTarget``) is in :mod:`app.api.result_schemas`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, get_args, get_origin, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator

from app.api.registration_schemas import RegisterSpec, RegistrationPublic
from app.api.result_schemas import JobResult, JobTarget
from app.core.db import JobStatus
from app.core.labels import MAX_LABELS, check_labels
from cahp_engine.config import (
    Amount,
    Constraint,
    Interval,
    OffOr,
    PruningConfig,
    SubsetOf,
    TupleOf,
    settings_for,
)
from cahp_engine.data import DatasetOptions

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


_JOB_SETTINGS = {setting.name: setting for setting in settings_for("api")}


def param_field(name: str) -> Any:
    """The ``Field`` of the job setting ``name``, from its declaration in the engine.

    Unset (None) means the engine's default: the description gives it with the setting's help, and
    ``x-cahp-default`` as a value (the console's submit form shows it; absent when it is None). The bounds
    of its rule go into the JSON schema (``minimum``, ``exclusiveMaximum``, ...; the choices are the
    ``enum`` of its ``Literal`` type) without being enforced here: ``PruningConfig`` checks them and says
    what to change in the words ``cahp prune`` uses.
    """
    setting = _JOB_SETTINGS[name]
    default = list(setting.default) if isinstance(setting.default, tuple) else setting.default
    shown = json.dumps(default) if isinstance(default, list) else str(default)
    return Field(default=None, description=setting.help_with_default(shown),
                 json_schema_extra=partial(_add_bounds, setting.rule, default))


def _add_bounds(rule: Constraint, default: Any, schema: dict[str, Any]) -> None:
    """Write ``rule``'s bounds into each branch of a property's schema that they apply to, and the default."""
    schema["x-cahp-default"] = default
    for branch in schema.get("anyOf", [schema]):
        kind = branch.get("type")
        if isinstance(rule, Interval) and kind in ("integer", "number"):
            branch.update(_interval_bounds(rule))
        elif isinstance(rule, Amount) and kind == "integer" and rule.count is not None:
            branch.update(_interval_bounds(rule.count))
        elif isinstance(rule, Amount) and kind == "number":
            branch.update(_interval_bounds(rule.fraction))
        elif isinstance(rule, OffOr) and kind == "integer":
            branch["anyOf"] = [{"const": 0}, _interval_bounds(rule.interval)]
        elif isinstance(rule, TupleOf) and kind == "array":
            branch["minItems"] = 1
            branch["items"].update(_interval_bounds(rule.item))
        elif isinstance(rule, SubsetOf) and kind == "array":
            branch.update(minItems=1, uniqueItems=True)


def _interval_bounds(interval: Interval) -> dict[str, Any]:
    bounds: dict[str, Any] = {}
    if interval.left is not None:
        bounds["minimum" if interval.closed in ("left", "both") else "exclusiveMinimum"] = interval.left
    if interval.right is not None:
        bounds["maximum" if interval.closed in ("right", "both") else "exclusiveMaximum"] = interval.right
    return bounds


def _json_type(hint: Any) -> Any:
    """A ``PruningConfig`` field's type as JSON carries it: a tuple is an array (a list)."""
    return list[get_args(hint)[0]] if get_origin(hint) is tuple else hint  # type: ignore[misc]


def _job_params_model() -> type[BaseModel]:
    """``JobParams``: one optional field per job setting, typed as ``PruningConfig`` types it.

    Built from the declarations, so a setting the engine adds is a job parameter too, described and
    bounded in the OpenAPI schema (:func:`param_field`); unset (None) means the engine's default.
    """
    hints = get_type_hints(PruningConfig)
    fields: dict[str, Any] = {name: (_json_type(hints[name]) | None, param_field(name)) for name in _JOB_SETTINGS}
    return create_model(
        "JobParams",
        __config__=ConfigDict(extra="forbid", strict=True),
        __doc__="Pruning settings, the same as the `cahp prune` options.\n\n"
        "Unset ones take the engine's defaults; ranges are checked as `cahp prune` checks them.",
        **fields,
    )


if TYPE_CHECKING:

    class JobParams(BaseModel):
        """One optional field per job setting (:data:`cahp_engine.config.SETTINGS` for the API)."""

else:
    JobParams = _job_params_model()


def given_params(params: JobParams) -> dict[str, Any]:
    """The settings the client set to a value (``null`` means "the default" for every one)."""
    return {k: v for k, v in params.model_dump(exclude_unset=True).items() if v is not None}


class JobCreate(_Input):
    model_config = ConfigDict(extra="forbid", serialize_by_alias=True)

    model: ModelSpec
    dataset: DatasetSpec
    params: JobParams = Field(default_factory=JobParams)
    name: str | None = Field(
        default=None, min_length=1, max_length=200,
        description="What to call the pruned model: the model cards' title, the console's and the registry's name",
        examples=["sst5-minilm-pruned"],
    )
    # "register" would shadow BaseModel.register: the attribute has another name, the JSON field this one.
    register_: RegisterSpec | None = Field(
        default=None, alias="register",
        description="Also register the pruned model in the server's MLflow model registry")
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


class JobCheck(BaseModel):
    """What ``POST /v1/jobs/check`` (and every submit) checked before the job would wait for a worker."""

    checked: list[str] = Field(description="What was checked and found usable")
    skipped: list[str] = Field(description="What only the worker can check (hf:// and s3:// inputs...), and why")


class JobError(BaseModel):
    code: str
    message: str


class AttemptPublic(BaseModel):
    """One attempt at a job: a worker's claim, until the job ended or left that worker."""

    number: int = Field(description="1 for the first claim; a handed-back attempt counts too")
    worker: str = Field(description="The worker's id (`host:pid:suffix`)")
    started_at: dt.datetime
    ended_at: dt.datetime | None = Field(description="Null while the attempt runs")
    end: Literal["completed", "failed", "cancelled", "handed_back", "lost"] | None = Field(
        description="Why it ended: the job `completed`, `failed` or was `cancelled`; the worker shut down and "
        "`handed_back` the job with its resume state; or the worker was `lost` (stopped renewing its lease)")
    resumed_from: str | None = Field(description="The saved step it went on from (`recovery_training step 63`); "
                                     "null when it started from the beginning")



class JobLinks(BaseModel):
    self: str
    logs: str
    artifacts: str
    cancel: str
    events: str
    deliveries: str


class JobPublic(BaseModel):
    model_config = ConfigDict(validate_by_name=True, serialize_by_alias=True)

    id: str
    status: JobStatus
    stage: str | None
    progress: float = Field(ge=0, le=1)
    eta_s: float | None = Field(default=None, description="Seconds the running attempt still needs, by its measured "
                                "pace so far; null when not known yet or not running")
    eta_reason: str | None = Field(default=None, description="Why `eta_s` is null while the job is not finished: "
                                   "waiting for a worker, a worker that stopped answering, a pace not measured yet")
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
    name: str | None = Field(default=None, description="The name given at submit")
    model_name: str | None = Field(default=None, description="The model by name: `result.base_model` once the job "
                                   "succeeded, else the hub id, the uploaded archive's or the directory's name")
    dataset_name: str | None = Field(default=None, description="The dataset by name")
    register_: RegisterSpec | None = Field(default=None, alias="register",
                                           description="The MLflow registration asked for at submit")
    registration: RegistrationPublic | None = Field(default=None, description="How the last registration went")
    registrations: list[RegistrationPublic] = Field(
        default_factory=list, description="Every registration of the job's model, oldest first: the job's own "
        "(`register` at submit), then each one `cahp register` added")
    attempts: list[AttemptPublic] = Field(default_factory=list, description="Every attempt so far, oldest first; "
                                          "`started_at` is the first one's")
    target: JobTarget | None = Field(default=None, description="A speed or FLOPs target's record, as soon as the "
                                     "run has pruned to it (before recovery); null for a run without a target")


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
    url: str = Field(description="The download route (needs the API key)")
    signed_url: str | None = Field(
        default=None, description="A link that downloads the artifact without a key until `signed_url_expires_at` "
        "(S3 presigned with an S3 store); null when the server gives out none (`CAHP_SIGNED_URL_TTL_S=0`)")
    signed_url_expires_at: dt.datetime | None = None


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
    #: Live workers started by this server (embedded mode); None where workers run elsewhere.
    workers: int | None = None


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
