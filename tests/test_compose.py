"""docker-compose.yml against the documented settings: every one reaches the containers, no credential is a default.

There is no Docker engine here, so the file is read with a YAML parser and interpolated the way
``docker compose config`` does (``${VAR}``, ``${VAR:-default}``, ``${VAR:?message}``, ``$$``), for the
default profile and for ``--profile s3``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.core.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / "cahp.env.example"
#: The variables the documented setup exports before `docker compose up` (docs/service.md#docker).
REQUIRED = {"POSTGRES_PASSWORD": "a-long-random-password"}
#: The services that run cahp (and so read its settings).
CAHP_SERVICES = ("api", "worker")
_VARIABLE = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:-|:\?|-|\?)(?P<arg>[^}]*))?\}|\$\$")


def documented_settings() -> set[str]:
    """The server settings in docs/service.md's table (the client's CAHP_URL/CAHP_API_KEY are not in it)."""
    text = (ROOT / "docs" / "service.md").read_text()
    table = text[text.index("## Settings"):text.index("## Model and dataset references")]
    rows = [line for line in table.splitlines() if line.startswith("| `CAHP_")]
    return {name for row in rows for name in re.findall(r"`(CAHP_[A-Z0-9_]+)`", row.split("|")[1])}


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """``docker compose config``'s interpolation of one value (recursively); raises as compose does."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, op, arg = match.group("name"), match.group("op"), match.group("arg")
        found = env.get(name)
        if op in (":?", "?") and (found is None or (op == ":?" and found == "")):
            raise ValueError(f"required variable {name} is missing a value: {arg}")
        if op in (":-", "-") and (found is None or (op == ":-" and found == "")):
            return arg
        return found or ""

    return _VARIABLE.sub(substitute, value)


def active(compose: dict[str, Any], profiles: set[str]) -> dict[str, Any]:
    return {name: service for name, service in compose["services"].items()
            if not service.get("profiles") or set(service["profiles"]) & profiles}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


def test_the_documented_settings_are_the_services_settings() -> None:
    fields = {f"CAHP_{name.upper()}" for name in Settings.model_fields}
    documented = documented_settings()
    assert sorted(fields - documented) == [], "settings missing from docs/service.md's table"
    assert sorted(documented - fields) == [], "documented settings the service does not read"


def test_every_documented_setting_is_in_the_env_file_example_and_nothing_is_set() -> None:
    lines = ENV_EXAMPLE.read_text().splitlines()
    listed = {m.group(1) for line in lines if (m := re.match(r"^# (CAHP_[A-Z0-9_]+)=", line))}
    assert listed == documented_settings()
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= {
        m.group(1) for line in lines if (m := re.match(r"^# ([A-Z_]+)=", line))}
    # Every line is a comment or empty: copying the example sets nothing, credentials least of all.
    assert all(line == "" or line.startswith("#") for line in lines)


@pytest.mark.parametrize("profiles", [set(), {"s3"}], ids=["default", "s3"])
def test_compose_interpolates_and_hands_every_setting_to_the_containers(
    compose: dict[str, Any], profiles: set[str]
) -> None:
    services = active(interpolate(compose, dict(REQUIRED)), profiles)
    assert set(CAHP_SERVICES) <= set(services)
    assert ({"minio", "minio-bucket"} <= set(services)) == ("s3" in profiles)
    for name, service in services.items():
        for needed in service.get("depends_on", {}):
            assert needed in services, f"{name} depends on {needed}, which the profile does not start"
        images = service.get("image") or service.get("build")
        assert images, f"{name} has no image"
    for name in CAHP_SERVICES:
        service = services[name]
        # The operator's settings file reaches the container, optional so that `config` works without it.
        assert service["env_file"] == [{"path": "./cahp.env", "required": False}], name
        environment = service.get("environment", {})
        # What the file itself sets is the topology only; each of those is a setting the docs list.
        assert set(environment) == {"CAHP_DATABASE_URL", "CAHP_BROKER_URL"}, name
        assert set(environment) <= documented_settings()
        assert environment["CAHP_DATABASE_URL"] == (
            f"postgresql+psycopg://cahp:{REQUIRED['POSTGRES_PASSWORD']}@postgres:5432/cahp")
    if "s3" in profiles:
        for name in ("minio", "minio-bucket"):
            assert services[name]["env_file"] == [{"path": "./cahp.env", "required": False}]
        assert "exit 1" in services["minio"]["command"][0]  # no credentials: MinIO refuses to start


def test_no_credential_has_a_default(compose: dict[str, Any]) -> None:
    # No `${VAR:-value}` default anywhere for a password, secret, key or token.
    for match in _VARIABLE.finditer(COMPOSE.read_text()):
        name = match.group("name") or ""
        if any(word in name for word in ("PASSWORD", "SECRET", "TOKEN", "KEY", "USER")):
            assert match.group("op") in (None, ":?", "?"), f"{match.group(0)} gives a credential a default"
    with pytest.raises(ValueError, match="POSTGRES_PASSWORD"):
        interpolate(compose, {})  # without it, `docker compose config` stops and says so
    resolved = interpolate(compose, dict(REQUIRED))
    for name, service in resolved["services"].items():
        environment = service.get("environment", {})
        values = environment.items() if isinstance(environment, dict) else (e.split("=", 1) for e in environment)
        for key, value in values:
            assert not key.startswith("AWS_"), f"{name} sets {key}: it would override an instance role"
            if any(word in key for word in ("PASSWORD", "SECRET", "TOKEN", "KEY")):
                assert value == REQUIRED["POSTGRES_PASSWORD"], (name, key)  # only the one the operator exported


def test_the_workers_gpu_comes_from_cahp_env_and_third_party_images_are_pinned(compose: dict[str, Any]) -> None:
    resolved = interpolate(compose, dict(REQUIRED))
    worker = resolved["services"]["worker"]
    # Compose leaves it alone ($$): the container's shell reads it, from the env file like every setting.
    assert "CUDA_VISIBLE_DEVICES=${CAHP_WORKER_GPU:-0} exec cahp worker --device cuda:0" in worker["command"][2]
    assert "CAHP_WORKER_GPU" not in {m.group("name") for m in _VARIABLE.finditer(COMPOSE.read_text())}
    assert worker["env_file"] == [{"path": "./cahp.env", "required": False}]
    assert "CAHP_WORKER_GPU=0" in ENV_EXAMPLE.read_text()
    for name in ("minio", "minio-bucket"):
        image = resolved["services"][name]["image"]
        assert re.fullmatch(r"minio/(minio|mc):RELEASE\.\d{4}-\d\d-\d\dT\d\d-\d\d-\d\dZ", image), image
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert dockerfile.count("pip install -c constraints.txt") == 2  # torch and the rest at the tested versions
    pins = [line for line in (ROOT / "constraints.txt").read_text().splitlines() if line and not line.startswith("#")]
    assert pins and all(re.fullmatch(r"[a-z0-9._-]+==[0-9][^ ]*", line) for line in pins)
