"""Every run setting is declared once (``cahp_engine.config.SETTINGS``) and appears, the same, on each
surface it is declared for: ``PruningConfig`` (fields, defaults, checks), the job API (``JobParams``
and the ``params`` schema of the real app's /openapi.json: description, bounds, choices) and
``cahp prune`` (one flag each: default, help, choices, how its text is read)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

import pytest
from fastapi.testclient import TestClient
from jsonschema import Draft202012Validator
from sqlalchemy import Engine

from app.api.main import create_app
from app.api.result_schemas import JobResult
from app.api.schemas import JobParams
from app.cli.prune import config_from_args, register
from app.core.settings import Settings
from cahp_engine.config import (
    SETTINGS,
    Amount,
    Interval,
    OffOr,
    Options,
    PruningConfig,
    Setting,
    SubsetOf,
    TupleOf,
    settings_for,
)
from cahp_engine.errors import ConfigError
from cahp_engine.run import RunSummary
from tests.support.helpers import job_body, new_key

API = settings_for("api")
CLI = settings_for("cli")


def _intervals(rule: Any) -> list[Interval]:
    if isinstance(rule, Interval):
        return [rule]
    if isinstance(rule, Amount):
        return [rule.fraction] + ([rule.count] if rule.count is not None else [])
    if isinstance(rule, OffOr):
        return [rule.interval]
    if isinstance(rule, TupleOf):
        return [rule.item]
    return []


def _probes(rule: Any, json_type: str) -> list[Any]:
    """Values of ``json_type`` on and just beside every bound of ``rule`` (and a few more)."""
    bounds = {b for i in _intervals(rule) for b in (i.left, i.right) if b is not None} | {0, 1}
    if json_type == "integer":
        return sorted({int(b) + d for b in bounds for d in (-1, 0, 1)})
    if json_type == "number":
        near = {x for b in bounds for x in (math.nextafter(b, -math.inf), float(b), math.nextafter(b, math.inf))}
        return sorted(near | {0.5})
    if json_type == "string":
        words = rule.values if isinstance(rule, Options) else rule.words if isinstance(rule, Amount) else ()
        return [*words, "auto", "all", "nope", ""]
    if json_type == "array" and isinstance(rule, SubsetOf):
        first, *rest = rule.values
        return [[], [first], [first, *rest[:1]], list(rule.values), [first, first], ["nope"], [first, "nope"]]
    if json_type == "array":
        return [[], *([v] for v in _probes(rule, "integer")), [2, 0], [2, 11]]
    raise AssertionError(json_type)


def _text(value: Any) -> str:
    """A value as it is written on the command line."""
    if isinstance(value, tuple | list):
        return ",".join(map(str, value))
    return repr(value) if isinstance(value, float) else str(value)


def _json_type(hint: Any) -> Any:
    return list[get_args(hint)[0]] if get_origin(hint) is tuple else hint  # type: ignore[misc]


# --- the engine -----------------------------------------------------------------------------------------------


def test_pruning_config_has_one_field_per_setting_with_its_default() -> None:
    fields = dataclasses.fields(PruningConfig)
    assert [f.name for f in fields] == [s.name for s in SETTINGS]
    assert [f.default for f in fields] == [s.default for s in SETTINGS]
    assert PruningConfig().to_dict() == {s.name: list(s.default) if isinstance(s.default, tuple) else s.default
                                         for s in SETTINGS}


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.name)
def test_each_setting_has_help_and_a_default_its_rule_accepts(setting: Setting) -> None:
    assert setting.help and setting.surfaces and setting.surfaces <= {"cli", "api"}
    assert setting.default in setting.rule or (setting.default is None and setting.nullable)
    assert setting.nullable == (setting.default is None)


def test_the_device_is_set_on_the_command_line_only() -> None:
    assert [s.name for s in SETTINGS if s not in API] == ["device"]
    assert CLI == SETTINGS


# --- the job API ----------------------------------------------------------------------------------------------


def test_job_params_mirror_the_api_settings_with_the_engine_types() -> None:
    hints = get_type_hints(PruningConfig)
    assert list(JobParams.model_fields) == [s.name for s in API]
    for setting in API:
        assert JobParams.model_fields[setting.name].annotation == _json_type(hints[setting.name]) | None, setting.name
        assert JobParams.model_fields[setting.name].default is None


def test_job_result_mirrors_the_run_summary() -> None:
    hints = get_type_hints(RunSummary)
    assert list(JobResult.model_fields) == [f.name for f in dataclasses.fields(RunSummary)]
    for name, field in JobResult.model_fields.items():
        expected = hints[name] if type(None) in get_args(hints[name]) else hints[name] | None
        assert field.annotation == expected, name


def test_each_result_figure_is_described_in_the_schema() -> None:
    """``JobResult`` takes its fields from ``RunSummary``; a new figure needs its words for the OpenAPI schema."""
    assert [name for name, field in JobResult.model_fields.items() if not field.description] == []


@pytest.fixture
def openapi_params(settings: Settings, engine: Engine) -> dict[str, Any]:
    with TestClient(create_app(settings)) as client:
        spec = client.get("/openapi.json").json()
    schema: dict[str, Any] = spec["components"]["schemas"]["JobParams"]
    return schema


def test_the_openapi_params_carry_each_settings_help_default_bounds_and_choices(
    openapi_params: dict[str, Any],
) -> None:
    assert openapi_params["additionalProperties"] is False
    assert list(openapi_params["properties"]) == [s.name for s in API]
    for setting in API:
        prop = openapi_params["properties"][setting.name]
        shown = json.dumps(list(setting.default)) if isinstance(setting.default, tuple) else str(setting.default)
        assert prop["description"] == setting.help_with_default(shown)
        branches = [b for b in prop["anyOf"] if b.get("type") != "null"]
        assert len(branches) == len(prop["anyOf"]) - 1 and prop.get("default") is None  # unset: the default
        # ... which the console's submit form reads as a value (no default, none: the document leaves out nulls).
        default = list(setting.default) if isinstance(setting.default, tuple) else setting.default
        assert prop.get("x-cahp-default") == default, setting.name
        if isinstance(setting.rule, Options):
            assert [b.get("enum", [b.get("const")]) for b in branches] == [list(setting.rule.values)]
        for branch in branches:
            validator = Draft202012Validator(branch)
            for value in _probes(setting.rule, branch["type"]):
                # The schema accepts a value of this branch's type exactly when the engine does.
                assert validator.is_valid(value) == (value in setting.rule), (setting.name, branch, value)


@pytest.mark.parametrize("setting", [s for s in API if _intervals(s.rule)], ids=lambda s: s.name)
def test_the_api_refuses_an_out_of_range_value_with_the_engines_message(
    setting: Setting, settings: Settings, engine: Engine
) -> None:
    kind = _intervals(setting.rule)[0].kind
    value = next(v for v in _probes(setting.rule, "integer" if kind == "integer" else "number")
                 if v not in setting.rule)
    sent = [value] if isinstance(setting.rule, TupleOf) else value
    with pytest.raises(ConfigError) as refused:
        PruningConfig.from_dict({setting.name: sent})
    with TestClient(create_app(settings), headers={"Authorization": f"Bearer {new_key(engine)}"}) as client:
        response = client.post("/v1/jobs", json=job_body("hf://org/model", "hf://datasets/org/data",
                                                          **{setting.name: sent}))
    assert response.status_code == 422, response.text
    assert response.json()["code"] == "invalid_config" and response.json()["detail"] == str(refused.value)


# --- cahp prune -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prune_parser() -> argparse.ArgumentParser:
    return register(argparse.ArgumentParser(prog="cahp").add_subparsers())


def test_cahp_prune_has_one_flag_per_setting_with_its_default_help_and_choices(
    prune_parser: argparse.ArgumentParser,
) -> None:
    actions = {a.dest: a for a in prune_parser._actions}
    text = prune_parser.format_help()
    for setting in CLI:
        action = actions[setting.name]
        assert action.option_strings == [setting.flag] and setting.flag in text
        assert action.default == setting.default and action.help, setting.name
        assert action.choices == (setting.rule.values if isinstance(setting.rule, Options) else None)
        if setting.metavar:
            assert action.metavar == setting.metavar
    assert actions["max_accuracy_drop"].metavar == "P"


def _parse(parser: argparse.ArgumentParser, setting: Setting, value: Any) -> argparse.Namespace:
    return parser.parse_args(["m", "d", "-o", "out", f"{setting.flag}={_text(value)}"])


@pytest.mark.parametrize("setting", [s for s in CLI if not isinstance(s.rule, Options)], ids=lambda s: s.name)
def test_each_flag_reaches_the_config_and_is_checked_by_the_same_rule(
    prune_parser: argparse.ArgumentParser, setting: Setting
) -> None:
    kinds = {"integer"} if isinstance(setting.rule, OffOr) else {i.kind for i in _intervals(setting.rule)}
    values: list[Any] = [v for kind in kinds for v in _probes(setting.rule, "integer" if kind == "integer"
                                                               else "number")]
    if isinstance(setting.rule, TupleOf | SubsetOf):
        values = [v for v in _probes(setting.rule, "array") if v]
    if isinstance(setting.rule, Amount):
        values += setting.rule.words
    elif not values:
        values = ["cuda:1", "cpu", "tpu"]  # the device
    for value in values:
        args = _parse(prune_parser, setting, value)
        if value in setting.rule:
            got = getattr(config_from_args(args)[0], setting.name)
            assert got == (tuple(value) if isinstance(value, list) else value), (setting.name, value)
        else:
            with pytest.raises(ConfigError, match=f"^`{setting.name}` must be "):
                config_from_args(args)


def test_a_flag_text_that_is_no_value_is_a_usage_error(
    prune_parser: argparse.ArgumentParser, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for flag, text, message in (("--reported-degrees", "2,x", "expected integers separated by commas"),
                                ("--calibration-fraction", "most", "expected auto or a fraction like 0.25"),
                                ("--warmup-ratio", "some", "invalid float value: 'some'")):
        with pytest.raises(SystemExit):
            prune_parser.parse_args(["m", "d", "-o", str(tmp_path), flag, text])
        assert message in capsys.readouterr().err
