"""Reference parsing, local-root checks, and the CAHP_* settings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from app.core.errors import InvalidReferenceError
from app.core.inputs.sources import parse_reference, resolve_local, shape_of_name
from app.core.settings import Settings, is_loopback
from cahp_engine.data import FILE_SUFFIXES


@pytest.mark.parametrize(
    ("uri", "role", "scheme", "target"),
    [
        ("hf://bert-base-uncased", "model", "hf", "bert-base-uncased"),
        ("hf://org/name", "model", "hf", "org/name"),
        ("hf://datasets/org/name", "dataset", "hf", "org/name"),
        ("hf://org/name", "dataset", "hf", "org/name"),
        ("file:///data/my%20model", "model", "file", "/data/my model"),
        ("file://localhost/data/x", "dataset", "file", "/data/x"),
        ("upload://" + "a" * 32, "model", "upload", "a" * 32),
        ("s3://bucket-1/models/m.tar.gz", "model", "s3", "bucket-1/models/m.tar.gz"),
    ],
)
def test_valid_references_parse(uri: str, role: str, scheme: str, target: str) -> None:
    ref = parse_reference(uri, role=role)  # type: ignore[arg-type]
    assert (ref.scheme, ref.target) == (scheme, target)


@pytest.mark.parametrize(
    ("uri", "role"),
    [
        ("bert-base-uncased", "model"),
        ("http://example.com/model", "model"),
        ("hf://datasets/org/name", "model"),
        ("hf://org/name/extra", "model"),
        ("hf://", "model"),
        ("file://remote-host/data", "model"),
        ("file://relative/path", "dataset"),
        ("upload://../../etc", "model"),
        ("s3://Bad_Bucket/key", "model"),
        ("s3://bucket", "model"),
    ],
)
def test_invalid_references_are_refused(uri: str, role: str) -> None:
    with pytest.raises(InvalidReferenceError):
        parse_reference(uri, role=role)  # type: ignore[arg-type]


def test_local_paths_must_resolve_under_an_allowed_root(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "models" / "m").mkdir(parents=True)
    outside.mkdir()
    (root / "escape").symlink_to(outside)
    settings = Settings(data_dir=tmp_path / "d", allowed_local_roots=(root,))
    assert resolve_local(str(root / "models" / "m"), settings) == (root / "models" / "m").resolve()
    assert resolve_local(str(root / "models" / ".." / "models" / "m"), settings).name == "m"
    for bad in (str(root / "escape"), str(outside), str(root / "missing"), str(root / ".." / "outside")):
        with pytest.raises(InvalidReferenceError):
            resolve_local(bad, settings)
    with pytest.raises(InvalidReferenceError, match="CAHP_ALLOWED_LOCAL_ROOTS"):
        resolve_local(str(root), Settings(data_dir=tmp_path / "d"))


def test_shapes_follow_the_engines_file_suffixes() -> None:
    assert all(shape_of_name(f"train{suffix}") == "file" for suffix in FILE_SUFFIXES)
    assert shape_of_name("model.TGZ") == "archive" and shape_of_name("models/bert/") == "directory"


def test_settings_come_from_cahp_variables(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CAHP_DATA_DIR", str(tmp_path / "d"))
    monkeypatch.setenv("CAHP_ALLOWED_LOCAL_ROOTS", os.pathsep.join([str(tmp_path / "a"), "", str(tmp_path / "b")]))
    monkeypatch.setenv("CAHP_DEVICE", "cuda:1")
    monkeypatch.setenv("CAHP_JOB_TIME_LIMIT_S", "600")
    settings = Settings()
    assert settings.allowed_local_roots == ((tmp_path / "a").resolve(), (tmp_path / "b").resolve())
    assert settings.device == "cuda:1" and settings.visibility_timeout_s == 600 + 3600
    assert settings.embedded_broker and settings.resolved_broker_url == f"sqla+sqlite:///{tmp_path / 'd' / 'broker.db'}"
    assert settings.resolved_database_url == f"sqlite:///{tmp_path / 'd' / 'cahp.db'}"
    assert settings.resolved_artifact_store == str(tmp_path / "d" / "artifacts") and not settings.s3_store
    child = Settings(**{k[5:].lower(): v for k, v in settings.child_environment().items()})
    assert child.resolved_database_url == settings.resolved_database_url
    assert child.allowed_local_roots == settings.allowed_local_roots


def test_settings_refuse_unsafe_or_invalid_values(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="must exceed"):
        Settings(data_dir=tmp_path, job_time_limit_s=3600, broker_visibility_timeout_s=3600)
    with pytest.raises(ValidationError, match="CAHP_DEVICE"):
        Settings(data_dir=tmp_path, device="tpu")
    with pytest.raises(ValidationError):
        Settings(data_dir=tmp_path, artifact_store="s3://")
    assert Settings(data_dir=tmp_path, artifact_store="s3://bucket/prefix").s3_store


@pytest.mark.parametrize(("host", "loopback"), [("127.0.0.1", True), ("::1", True), ("localhost", True),
                                                 ("127.8.0.1", True), ("0.0.0.0", False), ("10.0.0.5", False),
                                                 ("example.com", False)])
def test_loopback_detection(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
