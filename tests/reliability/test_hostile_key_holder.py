"""A key holder turned attacker: each test replays one attack against the real service and shows it fails.

The attacks are the ones an audit of ``cahp serve`` found getting through: archive links
escaping their directory (including the PATH_MAX symlink chain of CVE-2025-4517), split names used as
file names, ``s3://`` references into the artifact store or unlisted buckets, safetensors indexes that
point outside the model or at a pickle, symlinks inside an allowed root, NUL bytes in references,
revoked keys, and server paths in what callers read.
"""

from __future__ import annotations

import io
import json
import os
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import torch
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from app.api.main import create_app
from app.core.db import Job, make_session_factory, repository, transaction
from app.core.errors import InvalidUploadError
from app.core.inputs import check_archive, unpack
from app.core.settings import Settings
from app.core.storage import open_store
from cahp_engine.errors import ModelLoadError
from cahp_engine.models import check_weight_files, load_classifier
from tests.support import jobs
from tests.support.helpers import (
    job_body,
    migrated_engine,
    moto_s3_server,
    new_key,
    service_settings,
    write_split,
    write_tiny_dataset,
    write_tiny_model,
)
from worker.runner import Outcome, WorkerContext, execute_job

LIMITS = {"max_bytes": 10_000_000, "max_members": 1000}


@pytest.fixture
def api_key(alice: str) -> str:
    """The client is alice's."""
    return alice


@pytest.fixture
def local(settings: Settings) -> Path:
    return settings.allowed_local_roots[0]


def _context(settings: Settings, engine: Engine) -> WorkerContext:
    return WorkerContext(settings=settings, sessions=make_session_factory(engine), store=open_store(settings),
                         worker_id="attacked-worker")


def _refused_then_failed(client: TestClient, settings: Settings, engine: Engine, body: dict[str, Any],
                         code: str) -> dict[str, Any]:
    """Submit refuses the job (the preflight runs the worker's checks); the worker, given it all the same
    (recorded as before the preflight), fails it with the same code and words. The job's error."""
    refused = client.post("/v1/jobs", json=body)
    assert refused.status_code == 422 and refused.json()["code"] == code, refused.text
    job_id = jobs.record(engine, body, key_name="alice")
    assert execute_job(job_id=job_id, context=_context(settings, engine)) is Outcome.failed
    error: dict[str, Any] = client.get(f"/v1/jobs/{job_id}").json()["error"]
    assert (error["code"], error["message"]) == (code, refused.json()["detail"])
    return error


def _problem(response: Any, status: int, code: str, *fragments: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    assert body["code"] == code, body
    for fragment in fragments:
        assert fragment in body["detail"], (fragment, body["detail"])
    return body


# --- archives ------------------------------------------------------------------------------------------


def _path_max_chain(target: Path, marker: str) -> bytes:
    """The CVE-2025-4517 archive: 16 nested 247-character directories with a symlink at each level,
    a last link climbing out by the link chain (its resolved path exceeds PATH_MAX, which defeats the
    ``data`` filter before Python 3.11.13), an ``escape`` link to ``target`` through it, and a file
    written through ``escape``."""
    component = "d" * 247
    steps = "abcdefghijklmnop"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        path = ""
        for step in steps:
            directory = tarfile.TarInfo(os.path.join(path, component))
            directory.type = tarfile.DIRTYPE
            tar.addfile(directory)
            link = tarfile.TarInfo(os.path.join(path, step))
            link.type, link.linkname = tarfile.SYMTYPE, component
            tar.addfile(link)
            path = os.path.join(path, component)
        chain = os.path.join(*steps)
        climb = tarfile.TarInfo(os.path.join(chain, "l" * 254))
        climb.type, climb.linkname = tarfile.SYMTYPE, "../" * len(steps)
        tar.addfile(climb)
        escape = tarfile.TarInfo("escape")
        escape.type = tarfile.SYMTYPE
        escape.linkname = os.path.join(chain, "l" * 254) + "/" + "../" * 8 + str(target).lstrip("/")
        tar.addfile(escape)
        payload = b"text,label\nwritten outside,1\n"
        member = tarfile.TarInfo(f"escape/{marker}")
        member.size = len(payload)
        tar.addfile(member, io.BytesIO(payload))
    return buffer.getvalue()


def test_the_path_max_symlink_chain_is_refused_at_upload_and_nothing_is_written_outside(
    client: TestClient, settings: Settings, engine: Engine, local: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    archive = _path_max_chain(outside, "pwned.csv")
    body = _problem(client.post("/v1/uploads", files={"file": ("data.tar", archive)}), 422, "invalid_upload",
                    "symbolic link", "tar -h")
    assert "upload://" not in json.dumps(body)
    # The same archive reached through file:// is refused by the worker before anything is written.
    (local / "chain.tar").write_bytes(archive)
    _refused_then_failed(client, settings, engine, job_body(f"file://{write_tiny_model(local / 'm')}",
                                                            f"file://{local / 'chain.tar'}"), "invalid_upload")
    assert list(outside.iterdir()) == []
    assert not list(tmp_path.rglob("pwned.csv"))
    with make_session_factory(engine)() as session:
        assert repository.get_upload(session, upload_id="0" * 32, owner_id="x") is None


def _tar_with(*members: tarfile.TarInfo) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for member in members:
            data = b"text,label\nx,1\n" if member.isfile() else None
            if data is not None:
                member.size = len(data)
            tar.addfile(member, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


LINK_ARCHIVES = {
    "symlink to a parent inside": [_member("d", tarfile.DIRTYPE), _member("d/up", tarfile.SYMTYPE, ".."),
                                   _member("train.csv")],
    "symlink chain out": [_member("d", tarfile.DIRTYPE), _member("d/up", tarfile.SYMTYPE, ".."),
                          _member("esc", tarfile.SYMTYPE, "d/up/..")],
    "symlink to a sibling file": [_member("train.csv"), _member("test.csv", tarfile.SYMTYPE, "train.csv")],
    "absolute symlink": [_member("train.csv", tarfile.SYMTYPE, "/etc/passwd")],
    "hard link inside": [_member("train.csv"), _member("test.csv", tarfile.LNKTYPE, "train.csv")],
    "hard link out": [_member("train.csv", tarfile.LNKTYPE, "../../etc/passwd")],
}


@pytest.mark.parametrize("case", list(LINK_ARCHIVES))
def test_link_members_of_every_kind_are_refused_at_upload_and_by_the_unpacker(
    case: str, client: TestClient, tmp_path: Path
) -> None:
    archive = _tar_with(*LINK_ARCHIVES[case])
    _problem(client.post("/v1/uploads", files={"file": ("d.tar.gz", archive)}), 422, "invalid_upload", "tar -h")
    path = tmp_path / "d.tar.gz"
    path.write_bytes(archive)
    with pytest.raises(InvalidUploadError, match="link"):
        check_archive(path, **LIMITS)
    with pytest.raises(InvalidUploadError, match="link"):
        unpack(path, tmp_path / "out", **LIMITS)
    assert not (tmp_path / "out").exists()


def test_a_zip_symlink_is_refused(client: TestClient) -> None:
    import stat

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        link = zipfile.ZipInfo("train.csv")
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(link, "../../../etc/passwd")
    _problem(client.post("/v1/uploads", files={"file": ("d.zip", buffer.getvalue())}), 422, "invalid_upload",
             "symbolic link")


# --- split names ------------------------------------------------------------------------------------


BAD_SPLITS = ["../../x", "/tmp/evil", "a/b", "..", ".hidden", "x\n", "a\\b", "x" * 101]


@pytest.mark.parametrize("field", ["train_split", "eval_split"])
@pytest.mark.parametrize("split", BAD_SPLITS)
def test_split_names_that_could_name_a_path_are_refused_at_submit(
    field: str, split: str, client: TestClient, local: Path
) -> None:
    train = write_split(local / "one" / "train.csv", 30, seed=1)
    test = write_split(local / "one" / "test.csv", 20, seed=2)
    body = job_body(f"file://{write_tiny_model(local / 'm')}", f"file://{train}")
    body["dataset"].update({"eval_uri": f"file://{test}", field: split})
    _problem(client.post("/v1/jobs", json=body), 422, "invalid_dataset", f"`{field}` must be a split name")


def test_a_split_name_that_reaches_the_worker_anyway_writes_nothing(
    client: TestClient, settings: Settings, engine: Engine, local: Path, tmp_path: Path
) -> None:
    # A row recorded before the rule existed (or written by hand) is checked again by the worker.
    train = write_split(local / "one" / "train.csv", 30, seed=1)
    test = write_split(local / "one" / "test.csv", 20, seed=2)
    body = job_body(f"file://{write_tiny_model(local / 'm')}", f"file://{train}")
    body["dataset"]["eval_uri"] = f"file://{test}"
    job_id = client.post("/v1/jobs", json=body).json()["id"]
    escape = tmp_path / "escaped"
    with transaction(make_session_factory(engine)) as session:
        row = session.get(Job, job_id)
        assert row is not None
        row.dataset = {**row.dataset, "eval_split": f"../../../../{escape.relative_to('/')}"}
    assert execute_job(job_id=job_id, context=_context(settings, engine)) is Outcome.failed
    job = client.get(f"/v1/jobs/{job_id}").json()
    assert job["error"]["code"] == "invalid_dataset" and "split name" in job["error"]["message"]
    assert not list(tmp_path.rglob("*escaped*"))


# --- s3:// references ---------------------------------------------------------------------------------


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[tuple[Settings, Any]]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with moto_s3_server() as endpoint:
        raw = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        for bucket in ("shared", "team-data", "private"):
            raw.create_bucket(Bucket=bucket)
        settings = service_settings(tmp_path, artifact_store="s3://shared/cahp", s3_endpoint_url=endpoint,
                                    s3_region="us-east-1", allowed_outbound_hosts=("127.0.0.1",),
                                    allowed_s3_prefixes=("s3://team-data/models", "shared"))
        yield settings, raw


def test_s3_references_reach_only_listed_prefixes_and_never_the_artifact_store(
    s3: tuple[Settings, Any], tmp_path: Path
) -> None:
    settings, raw = s3
    db = migrated_engine(settings)
    alice, bob = new_key(db, "alice"), new_key(db, "bob")
    with TestClient(create_app(settings)) as client:
        upload = client.post("/v1/uploads", files={"file": ("train.csv", b"text,label\nbob's secret,1\n")},
                             headers={"Authorization": f"Bearer {bob}"}).json()
        other = client.post("/v1/uploads", files={"file": ("test.csv", b"text,label\nbob's other,0\n")},
                            headers={"Authorization": f"Bearer {bob}"}).json()
        stored = f"cahp/uploads/{upload['id']}.csv"
        assert raw.get_object(Bucket="shared", Key=stored)["Body"].read().startswith(b"text,label")
        auth = {"Authorization": f"Bearer {alice}"}
        dataset = f"file://{write_tiny_dataset(settings.allowed_local_roots[0] / 'data')}"
        for uri in (f"s3://shared/{stored}", "s3://shared/cahp/uploads/", "s3://shared/cahp"):
            body = _problem(client.post("/v1/jobs", json=job_body(uri, dataset), headers=auth), 422,
                            "invalid_reference", "artifact store's own objects")
            assert other["id"] not in body["detail"]  # nothing about the store's other objects
        for uri in ("s3://private/model.tar.gz", "s3://team-data/other/model.tar.gz",
                    "s3://team-data/models-private/m.tar.gz"):
            _problem(client.post("/v1/jobs", json=job_body(uri, dataset), headers=auth), 422,
                     "invalid_reference", "not under a bucket or prefix this server may read")
        for uri in ("s3://team-data/models/../cahp/x.tar.gz", "s3://team-data/models//x.tar.gz"):
            _problem(client.post("/v1/jobs", json=job_body(uri, dataset), headers=auth), 422,
                     "invalid_reference", "'..' part")
        accepted = client.post("/v1/jobs", json=job_body("s3://team-data/models/tiny.tar.gz", dataset), headers=auth)
        assert accepted.status_code == 202, accepted.text
        # The other listed bucket is readable outside the store's prefix.
        assert client.post("/v1/jobs", json=job_body("s3://shared/public/m.tar.gz", dataset),
                           headers=auth).status_code == 202

        # A row pointing into the store (recorded before the rule, or by hand) fails in the worker.
        job_id = accepted.json()["id"]
        with transaction(make_session_factory(db)) as session:
            row = session.get(Job, job_id)
            assert row is not None
            row.model_uri = f"s3://shared/{stored}"
        assert execute_job(job_id=job_id, context=_context(settings, db)) is Outcome.failed
        job = client.get(f"/v1/jobs/{job_id}", headers=auth).json()
        assert job["error"]["code"] == "invalid_reference" and "artifact store" in job["error"]["message"]
    without = settings.model_copy(update={"allowed_s3_prefixes": ()})
    with TestClient(create_app(without)) as client:
        _problem(client.post("/v1/jobs", json=job_body("s3://team-data/models/tiny.tar.gz", "hf://datasets/a/b"),
                             headers={"Authorization": f"Bearer {alice}"}), 422, "invalid_reference",
                 "s3:// references are disabled", "CAHP_ALLOWED_S3_PREFIXES")
    db.dispose()


def test_the_allowed_prefixes_setting_is_checked(tmp_path: Path) -> None:
    assert service_settings(tmp_path, allowed_s3_prefixes="s3://a-bucket/x/,b-bucket").allowed_s3_prefixes == (
        "a-bucket/x", "b-bucket")
    with pytest.raises(ValueError, match="CAHP_ALLOWED_S3_PREFIXES"):
        service_settings(tmp_path, allowed_s3_prefixes="Bad_Bucket/x")


# --- model loading ----------------------------------------------------------------------------------


def _indexed_model(directory: Path, weight_map: dict[str, str]) -> Path:
    model = write_tiny_model(directory)
    (model / "model.safetensors").rename(model / "model-00001-of-00001.safetensors")
    (model / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return model


def test_an_index_pointing_outside_or_at_a_pickle_fails_the_job_and_torch_load_never_runs(
    client: TestClient, settings: Settings, engine: Engine, local: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    elsewhere = write_tiny_model(tmp_path / "elsewhere")
    calls: list[Any] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        raise AssertionError("torch.load was called")

    monkeypatch.setattr(torch, "load", refuse)
    dataset = f"file://{write_tiny_dataset(local / 'data')}"
    cases = {
        "outside": {"bert.embeddings.word_embeddings.weight": "../../../elsewhere/model.safetensors"},
        "absolute": {"bert.embeddings.word_embeddings.weight": str(elsewhere / "model.safetensors")},
        "pickle": {"bert.embeddings.word_embeddings.weight": "pytorch_model.bin"},
    }
    for name, weight_map in cases.items():
        model = _indexed_model(local / f"indexed-{name}", weight_map)
        (model / "pytorch_model.bin").write_bytes(b"not read: torch.load must never see it")
        error = _refused_then_failed(client, settings, engine, job_body(f"file://{model}", dataset),
                                     "model_not_loadable")
        assert "model.safetensors.index.json" in error["message"] and ".safetensors" in error["message"]
        # The engine refuses on its own too, before transformers sees the directory.
        with pytest.raises(ModelLoadError, match="index"):
            load_classifier(str(model))
        with pytest.raises(ModelLoadError):
            check_weight_files(model)
    assert calls == []


def test_an_index_naming_real_shards_still_loads(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    model = write_tiny_model(tmp_path / "sharded")
    keys = list(load_file(model / "model.safetensors"))
    (model / "model.safetensors").rename(model / "model-00001-of-00001.safetensors")
    (model / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": dict.fromkeys(keys, "model-00001-of-00001.safetensors")}))
    check_weight_files(model)
    assert load_classifier(str(model)).classifier_trained


@pytest.mark.parametrize("case", ["config", "header"])
def test_hostile_configs_and_safetensors_headers_are_model_not_loadable(
    case: str, client: TestClient, settings: Settings, engine: Engine, local: Path
) -> None:
    model = write_tiny_model(local / f"hostile-{case}")
    if case == "config":
        config = json.loads((model / "config.json").read_text())
        config.update(num_attention_heads=0, hidden_size="many", num_hidden_layers=-3)
        (model / "config.json").write_text(json.dumps(config))
    else:
        # An 8-byte header length far past the file's end, then garbage.
        (model / "model.safetensors").write_bytes((2**40).to_bytes(8, "little") + b"{not json" * 10)
    error = _refused_then_failed(client, settings, engine,
                                 job_body(f"file://{model}", f"file://{write_tiny_dataset(local / 'data')}"),
                                 "model_not_loadable")
    assert str(settings.data_dir) not in error["message"] and "Traceback" not in error["message"]


# --- file:// inputs -------------------------------------------------------------------------------------


def test_a_symlink_inside_an_allowed_root_to_a_file_outside_is_refused(
    client: TestClient, settings: Settings, engine: Engine, local: Path, tmp_path: Path
) -> None:
    secret = tmp_path / "secret"
    write_tiny_dataset(secret)
    data = local / "linked"
    data.mkdir()
    (data / "train.csv").symlink_to(secret / "train.csv")
    (data / "test.csv").symlink_to(secret / "test.csv")
    model = f"file://{write_tiny_model(local / 'm')}"
    body = _problem(client.post("/v1/jobs", json=job_body(model, f"file://{data}")), 422, "invalid_reference",
                    "link that leads out of the directories this server may read")
    assert str(secret) not in body["detail"]
    # A linked directory is followed, and its links are checked too.
    nested = local / "nested"
    nested.mkdir()
    (nested / "inner").symlink_to(data, target_is_directory=True)
    _problem(client.post("/v1/jobs", json=job_body(model, f"file://{nested}")), 422, "invalid_reference",
             "leads out")
    # The link may be swapped in after submit: the worker checks again.
    clean = write_tiny_dataset(local / "clean")
    job_id = client.post("/v1/jobs", json=job_body(model, f"file://{clean}")).json()["id"]
    (clean / "train.csv").unlink()
    (clean / "train.csv").symlink_to(secret / "train.csv")
    assert execute_job(job_id=job_id, context=_context(settings, engine)) is Outcome.failed
    assert client.get(f"/v1/jobs/{job_id}").json()["error"]["code"] == "invalid_reference"
    # Links that stay inside the roots are fine (a hub cache snapshot is made of them).
    inside = local / "inside"
    inside.mkdir()
    for split in ("train.csv", "test.csv"):
        (inside / split).symlink_to(clean / ("test.csv" if split == "train.csv" else split))
    assert client.post("/v1/jobs", json=job_body(model, f"file://{inside}")).status_code == 202


def test_paths_outside_the_roots_get_one_answer_whether_or_not_they_exist(
    client: TestClient, settings: Settings, local: Path, tmp_path: Path
) -> None:
    model = f"file://{write_tiny_model(local / 'm')}"
    answers = set()
    for path in ("/etc", "/etc/no-such-dir-here", str(tmp_path / "nothing"), f"{local}/../../etc"):
        body = _problem(client.post("/v1/jobs", json=job_body(model, f"file://{path}")), 422, "invalid_reference",
                        "not in a directory this server may read")
        answers.add(body["detail"].replace(f"file://{path}", "PATH"))
        assert str(local) not in body["detail"].replace(f"file://{path}", "")
    assert len(answers) == 1
    _problem(client.post("/v1/jobs", json=job_body(model, f"file://{local}/absent")), 422, "invalid_reference",
             "does not exist")


# --- references with control characters ------------------------------------------------------------


@pytest.mark.parametrize("uri", ["file:///tmp/x%00y", "file:///tmp/a%0Ab", "hf://org/name\n", "hf://org/na\x00me",
                                 "upload://" + "0" * 32 + "\r", "s3://bucket/key\x7f", "file:///tmp/\tx"])
def test_nul_and_control_characters_in_a_reference_are_a_422(uri: str, client: TestClient, local: Path) -> None:
    dataset = f"file://{write_tiny_dataset(local / 'data')}"
    for body in (job_body(uri, dataset), job_body("hf://org/model", uri)):
        _problem(client.post("/v1/jobs", json=body), 422, "invalid_reference", "control character")


# --- keys -------------------------------------------------------------------------------------------------


def test_a_revoked_key_is_refused_at_once_and_keys_are_listed_without_secrets(
    client: TestClient, settings: Settings, engine: Engine, alice: str, tmp_path: Path
) -> None:
    import subprocess

    from tests.support.processes import child_env

    assert client.get("/v1/jobs").status_code == 200
    env = child_env(data_dir=str(settings.data_dir), database_url=settings.resolved_database_url)
    listed = subprocess.run([sys.executable, "-m", "app.cli", "keys", "list", "--json"], env=env,
                            capture_output=True, text=True, timeout=120, check=True)
    keys = json.loads(listed.stdout)
    assert [k["name"] for k in keys] == ["alice"] and keys[0]["revoked_at"] is None
    assert keys[0]["last_used_at"] is not None and alice not in listed.stdout
    key_id = keys[0]["id"]
    # A name shared by two live keys is ambiguous: refused, with the ids to choose from.
    other = new_key(engine, "alice")
    ambiguous = subprocess.run([sys.executable, "-m", "app.cli", "keys", "revoke", "alice"], env=env,
                               capture_output=True, text=True, timeout=120)
    assert ambiguous.returncode == 2 and key_id in ambiguous.stderr and "by its id" in ambiguous.stderr
    revoked = subprocess.run([sys.executable, "-m", "app.cli", "keys", "revoke", key_id], env=env,
                             capture_output=True, text=True, timeout=120)
    assert revoked.returncode == 0, revoked.stderr
    _problem(client.get("/v1/jobs"), 401, "unauthenticated")
    assert client.get("/v1/jobs", headers={"Authorization": f"Bearer {other}"}).status_code == 200
    table = subprocess.run([sys.executable, "-m", "app.cli", "keys", "list"], env=env, capture_output=True,
                           text=True, timeout=120, check=True).stdout
    assert key_id in table and "REVOKED" in table and other not in table
    unknown = subprocess.run([sys.executable, "-m", "app.cli", "keys", "revoke", "nobody"], env=env,
                             capture_output=True, text=True, timeout=120)
    assert unknown.returncode == 2 and "no API key" in unknown.stderr


def test_last_used_is_written_at_most_once_a_minute(client: TestClient, engine: Engine) -> None:
    from app.core.db import ApiKey

    client.get("/v1/jobs")
    with make_session_factory(engine)() as session:
        first = session.query(ApiKey).one().last_used_at
    for _ in range(5):
        client.get("/v1/jobs")
    with make_session_factory(engine)() as session:
        assert session.query(ApiKey).one().last_used_at == first is not None


# --- what callers read ----------------------------------------------------------------------------------


def test_an_unexpected_failure_shows_the_caller_an_error_id_not_a_traceback(
    client: TestClient, settings: Settings, engine: Engine, local: Path, caplog: pytest.LogCaptureFixture
) -> None:
    job_id = client.post("/v1/jobs", json=job_body(f"file://{write_tiny_model(local / 'm')}",
                                                   f"file://{write_tiny_dataset(local / 'd')}")).json()["id"]
    secret_path = str(settings.data_dir / "work" / "some" / "file.py")

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise KeyError(f"internal detail at {secret_path}")

    with caplog.at_level("ERROR"):
        assert execute_job(job_id=job_id, context=_context(settings, engine), pipeline=broken) is Outcome.failed
    job = client.get(f"/v1/jobs/{job_id}").json()
    logs = client.get(f"/v1/jobs/{job_id}/logs").json()["data"]
    error_id = job["error"]["message"].split("error id ")[1].split(")")[0]
    assert job["error"]["code"] == "internal_error" and "KeyError" in job["error"]["message"]
    for text in [job["error"]["message"], *(line["message"] for line in logs)]:
        assert "Traceback" not in text and secret_path not in text and str(settings.data_dir) not in text
    assert error_id in caplog.text and "Traceback" in caplog.text and secret_path in caplog.text


def test_job_errors_logs_and_the_report_name_the_job_uris_not_worker_paths(
    client: TestClient, settings: Settings, engine: Engine
) -> None:
    import tarfile as tf

    model_dir = write_tiny_model(settings.data_dir.parent / "src-model")
    buffer = io.BytesIO()
    with tf.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(model_dir, arcname="model")
    model = client.post("/v1/uploads", files={"file": ("model.tar.gz", buffer.getvalue())}).json()["uri"]
    data_dir = write_tiny_dataset(settings.data_dir.parent / "src-data")
    buffer = io.BytesIO()
    with tf.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(data_dir / "train.csv", arcname="train.csv")
        tar.add(data_dir / "test.csv", arcname="test.csv")
    dataset = client.post("/v1/uploads", files={"file": ("data.tar.gz", buffer.getvalue())}).json()["uri"]
    job_id = client.post("/v1/jobs", json=job_body(model, dataset)).json()["id"]
    assert execute_job(job_id=job_id, context=_context(settings, engine)) is Outcome.succeeded
    report = client.get(f"/v1/jobs/{job_id}/artifacts/report.json").json()
    logs = "\n".join(line["message"] for line in client.get(f"/v1/jobs/{job_id}/logs").json()["data"])
    assert report["model"]["ref"] == model and report["dataset"]["ref"] == dataset
    assert report["dataset"]["source"] == dataset
    for text in (json.dumps(report), logs):
        assert str(settings.data_dir) not in text and str(settings.resolved_work_dir) not in text
        assert sys.prefix not in text


def test_a_job_that_fails_on_a_missing_file_names_it_inside_the_model(
    client: TestClient, settings: Settings, engine: Engine
) -> None:
    model_dir = write_tiny_model(settings.data_dir.parent / "no-tokenizer")
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        (model_dir / name).unlink(missing_ok=True)
    (model_dir / "config.json").write_text("{not json")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(model_dir, arcname="model")
    model = client.post("/v1/uploads", files={"file": ("model.tar.gz", buffer.getvalue())}).json()["uri"]
    data = f"file://{write_tiny_dataset(settings.allowed_local_roots[0] / 'd')}"
    error = _refused_then_failed(client, settings, engine, job_body(model, data), "model_not_loadable")
    assert "<model>" in error["message"], error
    assert str(settings.data_dir) not in error["message"]


def test_a_revision_with_a_control_character_is_a_422(client: TestClient, local: Path) -> None:
    body = job_body("hf://org/model", f"file://{write_tiny_dataset(local / 'data')}")
    body["model"]["revision"] = "main\n"
    _problem(client.post("/v1/jobs", json=body), 422, "invalid_reference", "`model.revision`")
