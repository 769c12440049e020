"""The client's records against the real app's ``/openapi.json``, and how they read JSON.

Every record field must be a property of its schema with a type that accepts every value the schema
allows; every field a record cannot do without must be one the schema requires; the fields the
``cahp`` commands print must be there. Unknown fields are ignored (a newer server), missing optional
ones take their defaults (an older one), and a wrong type is the server's fault, not a ``KeyError``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from app.client import (
    ArtifactEntry,
    Attempt,
    CheckReport,
    DatasetRef,
    InvalidResponseError,
    JobFailure,
    JobResult,
    JobSnapshot,
    ListPage,
    LogEntry,
    ModelRef,
    UploadReceipt,
)

#: Each record and the schema component it reads.
SCHEMA_OF: dict[type, str] = {JobSnapshot: "JobPublic", JobFailure: "JobError", JobResult: "JobResult",
                              ModelRef: "ModelSpec", DatasetRef: "DatasetSpec", ArtifactEntry: "ArtifactPublic",
                              UploadReceipt: "UploadPublic", LogEntry: "LogLine", CheckReport: "JobCheck",
                              Attempt: "AttemptPublic"}
#: The fields app/cli/client_commands.py reads from each record.
USED_BY_THE_CLI: dict[type, set[str]] = {JobSnapshot: {"id", "status", "stage", "progress", "error", "labels"},
                                         JobFailure: {"code", "message"}, ArtifactEntry: {"name", "size", "sha256"},
                                         UploadReceipt: {"uri"}, LogEntry: {"message"}}


@pytest.fixture(scope="module")
def components(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from app.api.main import create_app
    from tests.support.helpers import service_settings

    spec = create_app(service_settings(Path(tmp_path_factory.mktemp("openapi")))).openapi()
    return spec["components"]["schemas"]


def _schema_types(schema: dict[str, Any], components: dict[str, Any]) -> set[str]:
    """The JSON types a property's schema allows: ``string``, ``date-time``, ``object:<Component>``..."""
    if "anyOf" in schema or "oneOf" in schema:
        return set().union(*(_schema_types(s, components) for s in schema.get("anyOf", schema.get("oneOf"))))
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        target = components[name]
        return {target["type"]} if "enum" in target else {f"object:{name}"}
    if schema.get("type") == "string" and schema.get("format") == "date-time":
        return {"date-time"}
    if schema.get("type") == "object" and schema.get("additionalProperties", {}).get("type") == "string":
        return {"object of strings"}
    if schema.get("type") == "array" and schema.get("items", {}).get("type") == "string":
        return {"array of strings"}
    if schema.get("type") == "array" and "$ref" in schema.get("items", {}):
        return {f"array of {t}" for t in _schema_types(schema["items"], components)}
    return {schema["type"]}


def _record_types(hint: Any) -> set[str]:
    """The JSON types a record field accepts."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return set().union(*(_record_types(arg) for arg in typing.get_args(hint)))
    if typing.get_origin(hint) is not None and issubclass(typing.get_origin(hint), Mapping):
        return {"object of strings"} if typing.get_args(hint) == (str, str) else {"object"}
    if typing.get_origin(hint) is tuple and typing.get_args(hint) == (str, ...):
        return {"array of strings"}
    if typing.get_origin(hint) is tuple and typing.get_args(hint)[1:] == (...,):
        return {f"array of {t}" for t in _record_types(typing.get_args(hint)[0])}
    simple = {type(None): {"null"}, str: {"string"}, int: {"integer"}, float: {"number", "integer"},
              bool: {"boolean"}, dt.datetime: {"date-time"}}
    return simple.get(hint) or {f"object:{SCHEMA_OF[hint]}"}


def _fields(record: type) -> dict[str, Any]:
    hints = typing.get_type_hints(record)
    return {f.name: hints[f.name] for f in dataclasses.fields(record) if f.name != "raw"}


def _required(record: type) -> set[str]:
    return {f.name for f in dataclasses.fields(record)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}


@pytest.mark.parametrize("record", list(SCHEMA_OF), ids=lambda r: r.__name__)
def test_each_record_field_is_in_its_schema_with_a_compatible_type(record: type, components: dict[str, Any]) -> None:
    schema = components[SCHEMA_OF[record]]
    for name, hint in _fields(record).items():
        assert name in schema["properties"], f"{record.__name__}.{name} is not in {SCHEMA_OF[record]}"
        allowed = _schema_types(schema["properties"][name], components)
        assert allowed <= _record_types(hint), f"{record.__name__}.{name}: {hint} cannot hold all of {allowed}"
    # What a record cannot be built without, the API always sends; what the CLI prints, the record has.
    assert _required(record) <= set(schema.get("required", ())), record.__name__
    assert USED_BY_THE_CLI.get(record, set()) <= set(_fields(record)) & set(schema["properties"])


def test_the_result_has_every_field_of_the_schema_in_its_order(components: dict[str, Any]) -> None:
    """A job's result is the engine's summary; the client reads all of it, so a new figure cannot be left out."""
    assert list(_fields(JobResult)) == list(components["JobResult"]["properties"])


@pytest.mark.parametrize(("item", "page"), [(JobSnapshot, "Page_JobPublic_"), (ArtifactEntry, "Page_ArtifactPublic_")])
def test_a_page_reads_the_lists_envelope(item: type, page: str, components: dict[str, Any]) -> None:
    schema = components[page]
    assert set(_fields(ListPage)) == set(schema["properties"]) and _required(ListPage) <= set(schema["required"])
    assert schema["properties"]["data"]["items"]["$ref"].endswith(f"/{SCHEMA_OF[item]}")
    assert _schema_types(schema["properties"]["next_cursor"], components) == {"string", "null"}


def test_the_upload_answer_and_the_event_streams_data_are_the_schemas_the_records_read(
        components: dict[str, Any], tmp_path: Path) -> None:
    from app.api.main import create_app
    from tests.support.helpers import service_settings

    paths = create_app(service_settings(tmp_path)).openapi()["paths"]
    answer = paths["/v1/uploads"]["post"]["responses"]["201"]["content"]["application/json"]["schema"]
    assert answer["$ref"].endswith("/UploadPublic")
    job = paths["/v1/jobs/{job_id}"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert job["$ref"].endswith("/JobPublic")


# --- reading JSON ----------------------------------------------------------------------------------

FULL_JOB = {
    "id": "j1", "status": "failed", "stage": "recovery", "progress": 0.25, "cancel_requested": False,
    "model": {"uri": "hf://org/m", "revision": None}, "dataset": {"uri": "upload://abc", "eval_uri": None,
                                                                   "text_column": "text"},
    "params": {"epochs": 1}, "created_at": "2025-01-02T03:04:05Z", "started_at": "2025-01-02T03:05:00+00:00",
    "finished_at": None, "error": {"code": "oom", "message": "out of memory"},
    "result": {"heads_total": 8, "retention": 0.5, "speedup": None}, "labels": {"branch": "main"},
    "notify_url": None, "artifacts_expired": False, "links": {"self": "/v1/jobs/j1"},
    "attempts": [{"number": 1, "worker": "h:1:a", "started_at": "2025-01-02T03:05:00Z",
                  "ended_at": "2025-01-02T03:06:00Z", "end": "lost", "resumed_from": None},
                 {"number": 2, "worker": "h:2:b", "started_at": "2025-01-02T03:07:00Z", "ended_at": None,
                  "end": None, "resumed_from": "recovery_training step 63"}],
}


def test_a_job_is_read_whole_and_unknown_fields_are_kept_only_in_raw() -> None:
    job = JobSnapshot.from_json({**FULL_JOB, "a_field_from_a_newer_server": {"x": 1}})
    assert job.error == JobFailure(code="oom", message="out of memory")
    assert job.model == ModelRef(uri="hf://org/m") and job.dataset == DatasetRef(uri="upload://abc")
    assert job.result == JobResult(heads_total=8, retention=0.5)
    assert job.created_at == dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=dt.UTC) and job.finished_at is None
    assert dict(job.labels) == {"branch": "main"} and job.finished and job.progress == 0.25
    assert [(a.number, a.end, a.resumed_from) for a in job.attempts] == \
        [(1, "lost", None), (2, None, "recovery_training step 63")]
    assert job.raw["a_field_from_a_newer_server"] == {"x": 1} and job.raw["params"] == {"epochs": 1}
    with pytest.raises(TypeError):
        job.raw["id"] = "changed"  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.status = "succeeded"  # type: ignore[misc]


def test_an_older_servers_answer_builds_with_defaults() -> None:
    job = JobSnapshot.from_json({"id": "j1", "status": "queued"})
    assert (job.stage, job.progress, job.error, job.result, dict(job.labels), job.finished, job.attempts) == \
        (None, 0.0, None, None, {}, False, ())
    assert ArtifactEntry.from_json({"name": "report.json", "size": 3, "sha256": "ab"}).url is None
    assert UploadReceipt.from_json({"id": "u1", "uri": "upload://u1"}).size is None


@pytest.mark.parametrize(("record", "data", "words"), [
    (JobSnapshot, {"status": "running"}, "the answer has no `id`"),
    (JobSnapshot, {"id": "j1", "status": "running", "progress": "half"}, "`progress` is not what the API documents"),
    (JobSnapshot, {"id": "j1", "status": "running", "created_at": "yesterday"}, "`created_at`"),
    (JobSnapshot, {"id": "j1", "status": "running", "labels": {"a": 1}}, "`labels`"),
    (JobSnapshot, {"id": "j1", "status": "running", "error": "oom"}, "JobFailure: expected a JSON object"),
    (ArtifactEntry, {"name": "m.bin", "size": True, "sha256": "ab"}, "`size`"),
    (JobSnapshot, ["not", "an", "object"], "JobSnapshot: expected a JSON object, got list"),
])
def test_an_answer_that_is_not_the_record_is_an_invalid_response(record: type, data: Any, words: str) -> None:
    with pytest.raises(InvalidResponseError, match=words.replace("(", r"\(")):
        record.from_json(data)  # type: ignore[attr-defined]


def test_a_page_keeps_its_cursor_and_reads_each_item() -> None:
    page = ListPage.from_json({"data": [FULL_JOB, {"id": "j2", "status": "queued"}], "next_cursor": "c2"},
                          JobSnapshot.from_json)
    assert [job.id for job in page.data] == ["j1", "j2"] and page.next_cursor == "c2"
    assert ListPage.from_json({"data": [], "next_cursor": None}, ArtifactEntry.from_json) == ListPage(data=())
    with pytest.raises(InvalidResponseError, match="`data`"):
        ListPage.from_json({"data": {"j1": {}}}, JobSnapshot.from_json)
    line = LogEntry.from_json({"offset": 3, "time": "2025-01-02T03:04:05Z", "message": "epoch 1"})
    assert (line.offset, line.message) == (3, "epoch 1")
