"""Turning references into local directories: uploads, split files, file:// roots and s3:// objects."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from app.core.errors import InvalidReferenceError, InvalidUploadError
from app.core.inputs import InputFetcher
from app.core.settings import Settings
from app.core.storage import open_store
from tests.support.helpers import moto_s3_server, tar_directory, write_tiny_dataset, write_tiny_model


def _fetcher(settings: Settings, sessions: sessionmaker[Session], owner: str, workdir: Path) -> InputFetcher:
    return InputFetcher(settings=settings, sessions=sessions, store=open_store(settings), owner_id=owner,
                        workdir=workdir)


def _owner(client: TestClient, auth: dict[str, str]) -> str:
    # The owner id is the key's id: cahp_<id>_<secret>.
    return auth["Authorization"].split("_")[1]


def _upload(client: TestClient, auth: dict[str, str], path: Path) -> str:
    with open(path, "rb") as handle:
        response = client.post("/v1/uploads", files={"file": (path.name, handle)}, headers=auth)
    assert response.status_code == 201, response.text
    return str(response.json()["uri"])


def test_uploaded_archives_and_split_files_become_directories(
    client: TestClient, auth: dict[str, str], settings: Settings, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    model = _upload(client, auth, tar_directory(write_tiny_model(tmp_path / "m" / "model"), tmp_path / "m.tgz"))
    data = write_tiny_dataset(tmp_path / "d")
    train, test = _upload(client, auth, data / "train.csv"), _upload(client, auth, data / "test.csv")
    inputs = _fetcher(settings, sessions, _owner(client, auth), tmp_path / "work").prepare(
        model={"uri": model}, dataset={"uri": train, "eval_uri": test, "train_split": "fit", "eval_split": None})
    assert (Path(inputs.model_ref) / "config.json").is_file()
    assert Path(inputs.model_ref).name == "model"
    assert sorted(p.name for p in Path(inputs.dataset_ref).iterdir()) == ["fit.csv", "test.csv"]
    assert (Path(inputs.dataset_ref) / "fit.csv").read_bytes() == (data / "train.csv").read_bytes()


def test_hub_references_pass_through_and_single_files_alone_are_refused(
    client: TestClient, auth: dict[str, str], settings: Settings, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    fetcher = _fetcher(settings, sessions, _owner(client, auth), tmp_path / "work")
    inputs = fetcher.prepare(model={"uri": "hf://org/model"}, dataset={"uri": "hf://datasets/org/data"})
    assert (inputs.model_ref, inputs.dataset_ref) == ("org/model", "org/data")
    single = _upload(client, auth, write_tiny_dataset(tmp_path / "d") / "train.csv")
    with pytest.raises(InvalidReferenceError, match="eval_uri"):
        _fetcher(settings, sessions, _owner(client, auth), tmp_path / "w2").prepare(
            model={"uri": "hf://org/model"}, dataset={"uri": single})


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch, settings: Settings) -> Iterator[tuple[Settings, object]]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with moto_s3_server() as endpoint:
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        client.create_bucket(Bucket="artifacts")
        client.create_bucket(Bucket="models")
        yield settings.model_copy(update={"artifact_store": "s3://artifacts/cahp", "s3_endpoint_url": endpoint,
                                          "s3_region": "us-east-1",
                                          # moto listens on loopback, which outbound URLs may reach only when allowed
                                          "allowed_outbound_hosts": ("127.0.0.1",),
                                          "allowed_s3_prefixes": ("models",)}), client


def test_s3_prefixes_and_archives_are_downloaded(
    s3: tuple[Settings, object], sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    settings, client = s3
    model = write_tiny_model(tmp_path / "model")
    for path in model.iterdir():
        client.upload_file(str(path), "models", f"tiny/{path.name}")  # type: ignore[attr-defined]
    data_tar = tar_directory(write_tiny_dataset(tmp_path / "ds"), tmp_path / "ds.tar.gz")
    client.upload_file(str(data_tar), "models", "datasets/data.tar.gz")  # type: ignore[attr-defined]
    fetcher = InputFetcher(settings=settings, sessions=sessions, store=open_store(settings), owner_id="x",
                           workdir=tmp_path / "work")
    inputs = fetcher.prepare(model={"uri": "s3://models/tiny"}, dataset={"uri": "s3://models/datasets/data.tar.gz"})
    assert sorted(p.name for p in Path(inputs.model_ref).iterdir()) == sorted(p.name for p in model.iterdir())
    assert sorted(p.name for p in Path(inputs.dataset_ref).iterdir()) == ["test.csv", "train.csv"]
    with pytest.raises(InvalidReferenceError, match="matches no object"):
        InputFetcher(settings=settings, sessions=sessions, store=open_store(settings), owner_id="x",
                     workdir=tmp_path / "w2").prepare(model={"uri": "s3://models/absent"},
                                                      dataset={"uri": "hf://datasets/a/b"})
    with pytest.raises(InvalidReferenceError, match="does not exist"):
        InputFetcher(settings=settings, sessions=sessions, store=open_store(settings), owner_id="x",
                     workdir=tmp_path / "w3").prepare(model={"uri": "s3://models/absent.tar.gz"},
                                                      dataset={"uri": "hf://datasets/a/b"})


def test_an_unsafe_archive_in_s3_is_refused_at_run_time(
    s3: tuple[Settings, object], sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    settings, client = s3
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo("../../escape.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    client.put_object(Bucket="models", Key="evil.tar.gz", Body=buffer.getvalue())  # type: ignore[attr-defined]
    fetcher = InputFetcher(settings=settings, sessions=sessions, store=open_store(settings), owner_id="x",
                           workdir=tmp_path / "work")
    with pytest.raises(InvalidUploadError, match=r"\.\."):
        fetcher.prepare(model={"uri": "s3://models/evil.tar.gz"}, dataset={"uri": "hf://datasets/a/b"})
    assert not (tmp_path / "escape.txt").exists() and not (tmp_path / "work" / "escape.txt").exists()
