"""A key holder's dataset turned attacker: each test replays one attack on the real app and the real worker.

A dataset's own files name what ``datasets`` opens: a repository's ``README.md`` (or
``.huggingface.yaml``) lists ``data_files`` and ``data_dir``, a ``save_to_disk`` directory's
``state.json`` lists Arrow files. Unchecked, they reached any file the worker can read (another
key's uploads included, whose archive names came back as class names), and a few kilobytes of
Parquet declaring millions of rows filled the worker's memory. Each attack is refused at submit
(``422 invalid_dataset`` naming the entry) where the API can see it, and by the worker's engine
whatever reached it, with the secret in no error, log line or report.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from app.api.main import create_app
from app.core.db import make_session_factory
from app.core.settings import Settings
from app.core.storage import open_store
from tests.support.helpers import (
    job_body,
    moto_s3_server,
    new_key,
    service_settings,
    tar_directory,
    write_split,
    write_tiny_model,
)
from worker.runner import Outcome, WorkerContext, execute_job

datasets = pytest.importorskip("datasets")

SECRET = "TOP-SECRET-CLASS"
#: The row limit of these tests' server; the tiny datasets have 60 and 30 rows.
MAX_ROWS = 100


@pytest.fixture
def api_key(alice: str) -> str:
    """The client is alice's."""
    return alice


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return service_settings(tmp_path, max_dataset_rows=MAX_ROWS, hub_cache_dir=tmp_path / "hub-cache")


@pytest.fixture
def local(settings: Settings) -> Path:
    return settings.allowed_local_roots[0]


@pytest.fixture
def model(local: Path) -> str:
    return f"file://{write_tiny_model(local / 'model')}"


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """Labelled rows outside every allowed root, whose classes are the secret."""
    path = tmp_path / "secret" / "train.csv"
    path.parent.mkdir()
    path.write_text("text,label\n" + "".join(f"row {i},{SECRET}-{i % 3}\n" for i in range(30)))
    return path


def _context(settings: Settings, engine: Engine) -> WorkerContext:
    return WorkerContext(settings=settings, sessions=make_session_factory(engine), store=open_store(settings),
                         worker_id="attacked-worker")


def _problem(response: Any, status: int, code: str, *fragments: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    assert body["code"] == code, body
    for fragment in fragments:
        assert fragment in body["detail"], (fragment, body["detail"])
    return body


def _card(root: Path, config: dict[str, Any], *, name: str = "README.md") -> None:
    text = yaml.safe_dump({"configs": [{"config_name": "default", **config}]})
    (root / name).write_text(f"---\n{text}---\n# a dataset\n" if name == "README.md" else text)


#: A repository layout whose data files are named by relative globs, as on the hub.
HONEST = {"data_files": [{"split": "train", "path": "data/train-*.csv"}, {"split": "test", "path": "data/test-*.csv"}]}


def _repository(root: Path, config: dict[str, Any] | None = None) -> Path:
    write_split(root / "data" / "train-00000-of-00001.csv", 60, seed=1)
    write_split(root / "data" / "test-00000-of-00001.csv", 30, seed=2)
    _card(root, config or HONEST)
    return root


def _upload(client: TestClient, directory: Path, tmp_path: Path, headers: dict[str, str] | None = None) -> str:
    archive = tar_directory(directory, tmp_path / f"{directory.name}.tar.gz")
    response = client.post("/v1/uploads", files={"file": (archive.name, archive.read_bytes())}, headers=headers)
    assert response.status_code == 201, response.text
    uri: str = response.json()["uri"]
    return uri


def _failed(client: TestClient, job_id: str, settings: Settings, engine: Engine, code: str, *fragments: str,
            secrets: tuple[str, ...] = (SECRET,)) -> dict[str, Any]:
    """Run the job in the real worker; it fails with ``code``, and no secret is in what the caller can read."""
    assert execute_job(job_id=job_id, context=_context(settings, engine)) is Outcome.failed
    job = client.get(f"/v1/jobs/{job_id}").json()
    error: dict[str, Any] = job["error"]
    assert error["code"] == code, error
    for fragment in fragments:
        assert fragment in error["message"], (fragment, error["message"])
    logs = "\n".join(line["message"] for line in client.get(f"/v1/jobs/{job_id}/logs").json()["data"])
    artifacts = client.get(f"/v1/jobs/{job_id}/artifacts").json()["data"]
    assert not artifacts, artifacts  # no report.json of a job that read someone else's data
    for text in (json.dumps(job), logs):
        for secret in secrets:
            assert secret not in text
    return error


# --- repository cards: data_files and data_dir --------------------------------------------------------------


def _attacks(secret: Path, settings: Settings) -> dict[str, tuple[dict[str, Any], str]]:
    """Case -> (the hostile configuration, the entry the answer must name)."""
    uploads = f"{settings.data_dir}/artifacts/uploads/*.tar.gz"
    return {
        "absolute": ({"data_files": [{"split": "train", "path": str(secret)},
                                     {"split": "test", "path": "data/test-*.csv"}]}, str(secret)),
        "dot-dot": ({"data_files": [{"split": "train", "path": "../../../secret/train.csv"},
                                    {"split": "test", "path": "data/test-*.csv"}]}, "../../../secret/train.csv"),
        "glob over the store's uploads": ({"data_files": [{"split": "train", "path": uploads},
                                                          {"split": "test", "path": uploads}]}, uploads),
        "glob climbing out": ({"data_files": {"train": "data/../../**/*.csv", "test": "data/test-*.csv"}},
                              "data/../../**/*.csv"),
        "https URL": ({"data_files": [{"split": "train", "path": "https://169.254.169.254/latest/train.csv"}]},
                      "https://169.254.169.254/latest/train.csv"),
        "hf URL": ({"data_files": "hf://datasets/someone/private/train.csv"}, "hf://datasets/someone/private"),
        "chained URL": ({"data_files": [f"zip://train.csv::{secret.parent}/x.zip"]}, "zip://train.csv::"),
        "data_dir": ({"data_dir": "../../../secret"}, "`data_dir` '../../../secret'"),
    }


ATTACKS = ["absolute", "dot-dot", "glob over the store's uploads", "glob climbing out", "https URL", "hf URL",
           "chained URL", "data_dir"]


@pytest.mark.parametrize("case", ATTACKS)
def test_a_card_naming_files_outside_the_dataset_is_refused_at_submit(
    case: str, client: TestClient, settings: Settings, local: Path, model: str, secret: Path, tmp_path: Path
) -> None:
    assert list(_attacks(secret, settings)) == ATTACKS
    config, entry = _attacks(secret, settings)[case]
    directory = _repository(local / "hostile", config)
    body = _problem(client.post("/v1/jobs", json=job_body(model, f"file://{directory}")), 422, "invalid_dataset",
                    "README.md: configuration 'default' names the", entry, "inside the dataset directory")
    assert SECRET not in body["detail"]
    # The same dataset uploaded as an archive: the card is read from the stored archive.
    dataset = _upload(client, directory, tmp_path)
    _problem(client.post("/v1/jobs", json=job_body(model, dataset)), 422, "invalid_dataset",
             f"{dataset}: README.md: configuration 'default'", entry)


def test_a_standalone_yaml_and_malformed_front_matter_are_refused_at_submit(
    client: TestClient, local: Path, model: str, secret: Path, tmp_path: Path
) -> None:
    directory = _repository(local / "standalone")
    _card(directory, {"data_files": [{"split": "train", "path": str(secret)}]}, name=".huggingface.yaml")
    _problem(client.post("/v1/jobs", json=job_body(model, f"file://{directory}")), 422, "invalid_dataset",
             ".huggingface.yaml: configuration 'default'", "absolute path")
    _problem(client.post("/v1/jobs", json=job_body(model, _upload(client, directory, tmp_path))), 422,
             "invalid_dataset", ".huggingface.yaml: configuration 'default'")
    broken = _repository(local / "broken")
    (broken / "README.md").write_text("---\nconfigs: [{config_name: default, data_files: \n---\n")
    _problem(client.post("/v1/jobs", json=job_body(model, f"file://{broken}")), 422, "invalid_dataset",
             "README.md: the YAML front matter cannot be parsed")


def test_cards_swapped_in_after_submit_fail_the_job_and_read_nothing(
    client: TestClient, settings: Settings, engine: Engine, local: Path, model: str, secret: Path, tmp_path: Path
) -> None:
    # Bob's uploads sit in the artifact store; the glob case aims alice's job at them, with the
    # text and label columns pointed at the names `datasets` gives a tar archive's members.
    bob = {"Authorization": f"Bearer {new_key(engine, 'bob')}"}
    bobs = [_upload(client, write_split(tmp_path / f"bob{i}" / "train.csv", 5, seed=i).parent, tmp_path, bob)
            for i in range(2)]
    bob_ids = tuple(uri.removeprefix("upload://") for uri in bobs)
    for case, (config, _entry) in _attacks(secret, settings).items():
        directory = _repository(local / f"swapped-{case.replace(' ', '-')}")
        body = job_body(model, f"file://{directory}")
        if case == "glob over the store's uploads":
            body["dataset"].update(text_column="__key__", label_column="__url__")
        job_id = client.post("/v1/jobs", json=body).json()["id"]
        _card(directory, config)
        _failed(client, job_id, settings, engine, "invalid_dataset", "configuration 'default' names the",
                secrets=(SECRET, *bob_ids))


def test_a_linked_directory_inside_the_dataset_is_refused_at_submit_and_in_the_worker(
    client: TestClient, settings: Settings, engine: Engine, local: Path, model: str
) -> None:
    # Another dataset in the same allowed root: the file:// rules let a link reach it, the dataset rule does not.
    other = local / "someone-else"
    other.mkdir()
    (other / "train-secret.csv").write_text("text,label\n" + "".join(f"r{i},{SECRET}-{i % 2}\n" for i in range(9)))
    config = {"data_files": [{"split": "train", "path": "linked/*.csv"}, {"split": "test", "path": "data/test-*.csv"}]}
    directory = _repository(local / "linking", config)
    (directory / "linked").symlink_to(other, target_is_directory=True)
    _problem(client.post("/v1/jobs", json=job_body(model, f"file://{directory}")), 422, "invalid_dataset",
             "'linked' in", "is a link that leads out of the dataset directory")
    clean = _repository(local / "clean")
    job_id = client.post("/v1/jobs", json=job_body(model, f"file://{clean}")).json()["id"]
    (clean / "linked").symlink_to(other, target_is_directory=True)
    _card(clean, config)
    _failed(client, job_id, settings, engine, "invalid_dataset", "is a link that leads out of the dataset directory")


def test_s3_datasets_have_their_cards_checked_at_submit(
    engine: Engine, local: Path, model: str, secret: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    hostile = _repository(tmp_path / "hostile", {"data_files": str(secret)})
    honest = _repository(tmp_path / "honest")
    with moto_s3_server() as endpoint:
        raw = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        raw.create_bucket(Bucket="team-data")
        for directory in (hostile, honest):
            for path in directory.rglob("*"):
                if path.is_file():
                    raw.upload_file(str(path), "team-data", f"{directory.name}/{path.relative_to(directory)}")
            archive = tar_directory(directory, tmp_path / f"{directory.name}.tar.gz")
            raw.upload_file(str(archive), "team-data", f"archives/{archive.name}")
        settings = service_settings(tmp_path, s3_endpoint_url=endpoint, s3_region="us-east-1",
                                    allowed_outbound_hosts=("127.0.0.1",), allowed_s3_prefixes=("team-data",))
        alice = {"Authorization": f"Bearer {new_key(engine, 'alice-s3')}"}
        with TestClient(create_app(settings), headers=alice) as client:
            for uri in ("s3://team-data/hostile", "s3://team-data/archives/hostile.tar.gz"):
                _problem(client.post("/v1/jobs", json=job_body(model, uri)), 422, "invalid_dataset",
                         f"{uri}: README.md: configuration 'default' names the data file", str(secret))
            for uri in ("s3://team-data/honest", "s3://team-data/archives/honest.tar.gz",
                        "s3://team-data/not-there-yet.tar.gz"):
                assert client.post("/v1/jobs", json=job_body(model, uri)).status_code == 202, uri


# --- save_to_disk directories ----------------------------------------------------------------------------------


def _saved(root: Path) -> Path:
    features = datasets.Features({"text": datasets.Value("string"), "label": datasets.ClassLabel(names=["a", "b"])})
    part = datasets.Dataset.from_dict({"text": [f"t{i}" for i in range(12)], "label": [i % 2 for i in range(12)]},
                                      features)
    datasets.DatasetDict({"train": part, "test": part}).save_to_disk(str(root))
    return root


def _secret_arrow(where: Path) -> Path:
    datasets.Dataset.from_dict({"text": ["x", "y"], "label": [f"{SECRET}-A", f"{SECRET}-B"]}).save_to_disk(str(where))
    return next(where.glob("*.arrow"))


def _point_state_at(root: Path, arrow: Path) -> str:
    state = root / "train" / "state.json"
    content = json.loads(state.read_text())
    name = os.path.relpath(arrow, root / "train")
    content["_data_files"] = [{"filename": name}]
    state.write_text(json.dumps(content))
    return name


def test_state_json_naming_arrow_files_elsewhere_is_refused_at_submit_and_in_the_worker(
    client: TestClient, settings: Settings, engine: Engine, local: Path, model: str, tmp_path: Path
) -> None:
    arrow = _secret_arrow(tmp_path / "elsewhere")
    directory = _saved(local / "saved")
    name = _point_state_at(directory, arrow)
    _problem(client.post("/v1/jobs", json=job_body(model, f"file://{directory}")), 422, "invalid_dataset",
             f"state.json names the data file {name!r}", "plain file name")
    # Uploaded, the directory passes submit (its JSON is read when the job runs) and fails in the worker.
    job_id = client.post("/v1/jobs", json=job_body(model, _upload(client, directory, tmp_path))).json()["id"]
    _failed(client, job_id, settings, engine, "invalid_dataset", "state.json names the data file")
    # Swapped in after submit under file://.
    clean = _saved(local / "clean-saved")
    job_id = client.post("/v1/jobs", json=job_body(model, f"file://{clean}")).json()["id"]
    _point_state_at(clean, arrow)
    _failed(client, job_id, settings, engine, "invalid_dataset", "state.json names the data file")


@pytest.mark.parametrize("name", ["train/state.json", "train/dataset_info.json", "dataset_dict.json"])
def test_a_link_among_the_json_files_is_refused(
    name: str, client: TestClient, settings: Settings, engine: Engine, local: Path, model: str
) -> None:
    other = _saved(local / "other-saved")
    directory = _saved(local / "saved")
    (directory / name).unlink()
    (directory / name).symlink_to(other / name)
    _problem(client.post("/v1/jobs", json=job_body(model, f"file://{directory}")), 422, "invalid_dataset",
             f"{Path(name).name} in", "is a link")
    clean = _saved(local / "clean")
    job_id = client.post("/v1/jobs", json=job_body(model, f"file://{clean}")).json()["id"]
    (clean / name).unlink()
    (clean / name).symlink_to(other / name)
    _failed(client, job_id, settings, engine, "invalid_dataset", "is a link")


def test_a_split_name_leading_out_of_a_saved_directory_is_refused(client: TestClient, local: Path, model: str) -> None:
    directory = _saved(local / "saved")
    _saved(local / "other")
    (directory / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "../other/test"]}))
    _problem(client.post("/v1/jobs", json=job_body(model, f"file://{directory}")), 422, "invalid_dataset",
             "dataset_dict.json names the split '../other/test'")


# --- hard links under file:// roots ----------------------------------------------------------------------------


def test_a_hard_link_under_a_file_root_is_refused_at_submit_and_in_the_worker(
    client: TestClient, settings: Settings, engine: Engine, local: Path, model: str, secret: Path
) -> None:
    directory = local / "hard"
    write_split(directory / "test.csv", 30, seed=2)
    os.link(secret, directory / "train.csv")
    _problem(client.post("/v1/jobs", json=job_body(model, f"file://{directory}")), 422, "invalid_reference",
             "'train.csv' is a file with 2 hard links", "Copy the file in")
    # A single split file given by itself is checked too.
    body = job_body(model, f"file://{directory / 'train.csv'}")
    body["dataset"]["eval_uri"] = f"file://{directory / 'test.csv'}"
    _problem(client.post("/v1/jobs", json=body), 422, "invalid_reference", "hard links")
    clean = local / "clean"
    write_split(clean / "train.csv", 60, seed=1)
    write_split(clean / "test.csv", 30, seed=2)
    job_id = client.post("/v1/jobs", json=job_body(model, f"file://{clean}")).json()["id"]
    (clean / "train.csv").unlink()
    os.link(secret, clean / "train.csv")
    _failed(client, job_id, settings, engine, "invalid_reference", "hard links")


# --- the row limit -----------------------------------------------------------------------------------------


def test_a_small_parquet_declaring_more_rows_than_the_limit_fails_before_it_is_read(
    client: TestClient, settings: Settings, engine: Engine, model: str, tmp_path: Path
) -> None:
    source = tmp_path / "many"
    source.mkdir()
    rows = 3 * MAX_ROWS
    frame = pd.DataFrame({"text": ["the same review"] * rows, "label": [i % 3 for i in range(rows)]})
    frame.to_parquet(source / "train.parquet")
    frame.head(30).to_parquet(source / "test.parquet")
    # Read from the Parquet footer when the archive was uploaded: refused at submit, in the worker's words.
    refused = client.post("/v1/jobs", json=job_body(model, _upload(client, source, tmp_path)))
    assert refused.status_code == 422 and refused.json()["code"] == "invalid_dataset", refused.text
    detail = refused.json()["detail"]
    for fragment in ("split 'train' (<dataset>/", f"train.parquet) declares {rows} rows, over the limit of "
                     f"{MAX_ROWS} rows per split", "CAHP_MAX_DATASET_ROWS"):
        assert fragment in detail, detail
    assert str(settings.data_dir) not in detail


# --- honest datasets keep working ----------------------------------------------------------------------------


def test_a_repository_with_relative_globbed_data_files_is_accepted_and_runs(
    client: TestClient, settings: Settings, engine: Engine, local: Path, model: str, tmp_path: Path
) -> None:
    directory = tmp_path / "honest"
    _repository(directory)
    for split in ("train", "test"):
        csv = directory / "data" / f"{split}-00000-of-00001.csv"
        pd.read_csv(csv).to_parquet(csv.with_suffix(".parquet"))
        csv.unlink()
    _card(directory, {"data_files": [{"split": "train", "path": "data/train-*.parquet"},
                                     {"split": "test", "path": ["data/test-*.parquet"]}]})
    dataset = _upload(client, directory, tmp_path)
    accepted = client.post("/v1/jobs", json=job_body(model, dataset))
    assert accepted.status_code == 202, accepted.text
    job_id = accepted.json()["id"]
    assert execute_job(job_id=job_id, context=_context(settings, engine)) is Outcome.succeeded
    report = client.get(f"/v1/jobs/{job_id}/artifacts/report.json").json()
    assert report["dataset"]["format"] == "repository" and report["dataset"]["train_rows"] == 60
    # The same layout under a file:// root is accepted too.
    in_root = local / "honest"
    os.rename(directory, in_root)
    assert client.post("/v1/jobs", json=job_body(model, f"file://{in_root}")).status_code == 202


def test_an_archive_whose_card_sits_in_its_only_directory_is_checked_there(
    client: TestClient, model: str, secret: Path, tmp_path: Path
) -> None:
    # `tar czf d.tar.gz d/` puts everything under d/; the unpacker makes d/ the dataset's root.
    directory = _repository(tmp_path / "d", {"data_files": str(secret)})
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(directory, arcname="./d")
    response = client.post("/v1/uploads", files={"file": ("d.tar.gz", buffer.getvalue())})
    _problem(client.post("/v1/jobs", json=job_body(model, response.json()["uri"])), 422, "invalid_dataset",
             "README.md: configuration 'default' names the data file")
    # The same as a zip, with a hidden file beside the directory (the unpacker passes it over).
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr(".DS_Store", b"")
        for path in directory.rglob("*"):
            if path.is_file():
                zf.write(path, f"d/{path.relative_to(directory)}")
    response = client.post("/v1/uploads", files={"file": ("d.zip", buffer.getvalue())})
    _problem(client.post("/v1/jobs", json=job_body(model, response.json()["uri"])), 422, "invalid_dataset",
             "README.md: configuration 'default' names the data file")
    # A README.md below the root is not the dataset's card.
    (directory / "README.md").rename(directory / "data" / "README.md")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(directory, arcname="d")
    response = client.post("/v1/uploads", files={"file": ("d.tar.gz", buffer.getvalue())})
    assert client.post("/v1/jobs", json=job_body(model, response.json()["uri"])).status_code == 202
