"""``POST /v1/uploads``: kinds, size limit, archive checks, generated storage names."""

from __future__ import annotations

import hashlib
import io
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from app.core.settings import Settings
from tests.support.helpers import job_body, tar_directory, write_tiny_dataset, write_tiny_model


def _problem(response: Any, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["code"] == code
    return str(response.json()["detail"])


def _tar(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def _file(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _link(name: str, target: str) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = tarfile.SYMTYPE
    info.linkname = target
    return info, None


def test_a_split_file_upload_is_stored_under_a_generated_name(
    client: TestClient, auth: dict[str, str], settings: Settings
) -> None:
    data = b"text,label\ngood film,1\nbad film,0\n"
    response = client.post("/v1/uploads", files={"file": ("../../etc/train.csv", data, "text/csv")}, headers=auth)
    assert response.status_code == 201, response.text
    upload = response.json()
    assert upload["uri"] == f"upload://{upload['id']}"
    assert (upload["kind"], upload["filename"], upload["size"]) == ("data", "train.csv", len(data))
    assert upload["sha256"] == hashlib.sha256(data).hexdigest()
    stored = settings.data_dir / "artifacts" / "uploads" / f"{upload['id']}.csv"
    assert stored.read_bytes() == data
    assert not (settings.data_dir / "etc").exists()


def test_an_upload_over_the_limit_is_413(client: TestClient, auth: dict[str, str], settings: Settings) -> None:
    too_big = b"a" * (settings.max_upload_bytes + 1)
    detail = _problem(client.post("/v1/uploads", files={"file": ("train.csv", too_big)}, headers=auth),
                      413, "payload_too_large")
    assert str(settings.max_upload_bytes) in detail
    assert list((settings.data_dir / "artifacts").glob("uploads/*")) == []


def test_a_chunked_upload_without_length_is_cut_off_at_the_limit(
    client: TestClient, auth: dict[str, str], settings: Settings
) -> None:
    boundary = "cahpboundary"
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"train.csv\"\r\n"
            "Content-Type: text/csv\r\n\r\n").encode()

    def body() -> Iterator[bytes]:  # no Content-Length: the server must count as it reads
        yield head
        for _ in range(settings.max_upload_bytes // 65536 + 4):
            yield b"b" * 65536
        yield f"\r\n--{boundary}--\r\n".encode()

    response = client.post("/v1/uploads", content=body(),
                           headers={**auth, "content-type": f"multipart/form-data; boundary={boundary}"})
    _problem(response, 413, "payload_too_large")


def test_uploads_of_unknown_kind_empty_or_without_the_file_field_are_422(
    client: TestClient, auth: dict[str, str]
) -> None:
    assert "accepted suffixes" in _problem(
        client.post("/v1/uploads", files={"file": ("model.bin", b"abc")}, headers=auth), 422, "invalid_upload")
    _problem(client.post("/v1/uploads", files={"file": ("train.csv", b"")}, headers=auth), 422, "invalid_upload")
    assert "`file`" in _problem(
        client.post("/v1/uploads", files={"data": ("train.csv", b"a")}, headers=auth), 422, "invalid_upload")
    assert client.post("/v1/uploads", headers=auth).status_code in (400, 422)


def test_unsafe_archives_are_refused_at_upload(client: TestClient, auth: dict[str, str]) -> None:
    cases = {
        "dotdot": _tar([_file("model/../../escape.txt")]),
        "absolute": _tar([_file("/etc/cron.d/evil")]),
        "symlink": _tar([_file("model/config.json"), _link("model/weights", "../../../etc/passwd")]),
        "abs-symlink": _tar([_link("model/weights", "/etc/passwd")]),
        "twice": _tar([_file("model/config.json"), _file("model/./config.json")]),
        "file-and-directory": _tar([_file("model/weights"), _file("model/weights/part-1")]),
    }
    for name, data in cases.items():
        detail = _problem(client.post("/v1/uploads", files={"file": (f"{name}.tar.gz", data)}, headers=auth),
                          422, "invalid_upload")
        # Named as the caller named it, never by the server's spool file.
        assert detail.startswith((f"{name}.tar.gz ", f"{name}.tar.gz:")), (name, detail)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("../evil.txt", "x")
    _problem(client.post("/v1/uploads", files={"file": ("evil.zip", buffer.getvalue())}, headers=auth),
             422, "invalid_upload")
    _problem(client.post("/v1/uploads", files={"file": ("junk.tar.gz", b"not an archive")}, headers=auth),
             422, "invalid_upload")


def test_an_archive_bomb_is_refused_by_its_unpacked_size(tmp_path: Path) -> None:
    from app.api.main import create_app
    from tests.support.helpers import migrated_engine, new_key, service_settings

    settings = service_settings(tmp_path, max_unpacked_bytes=100_000)
    engine = migrated_engine(settings)
    # 10 MB of zeros compresses to about 10 kB: small upload, large unpack.
    bomb = _tar([_file("model/zeros.bin", bytes(10_000_000))])
    assert len(bomb) < settings.max_upload_bytes
    with TestClient(create_app(settings)) as client:
        response = client.post("/v1/uploads", files={"file": ("bomb.tar.gz", bomb)},
                               headers={"Authorization": f"Bearer {new_key(engine)}"})
    assert "100000" in _problem(response, 422, "invalid_upload")
    engine.dispose()


def test_uploaded_archives_can_be_used_in_a_job(
    client: TestClient, auth: dict[str, str], tmp_path: Path
) -> None:
    model_tar = tar_directory(write_tiny_model(tmp_path / "model"), tmp_path / "model.tar.gz")
    data_tar = tar_directory(write_tiny_dataset(tmp_path / "ds"), tmp_path / "ds.tar.gz")
    uris = []
    for path in (model_tar, data_tar):
        with open(path, "rb") as handle:
            response = client.post("/v1/uploads", files={"file": (path.name, handle)}, headers=auth)
        assert response.status_code == 201, response.text
        assert response.json()["kind"] == "archive"
        uris.append(response.json()["uri"])
    job = client.post("/v1/jobs", json=job_body(uris[0], uris[1]), headers=auth)
    assert job.status_code == 202, job.text
    assert job.json()["model"]["uri"] == uris[0]
