"""Artifact links a deployer fetches without the API key: signed, expiring, tamper-proof, revoked with the job."""

from __future__ import annotations

import datetime as dt
import hashlib
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit

import boto3
import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from app.api.main import create_app
from app.core.security import KEY_FILE, ArtifactRef, key_id_of, local_link
from app.core.settings import Settings
from tests.support.helpers import migrated_engine, moto_s3_server, new_key, service_settings
from tests.support.jobs import finish, start, store, submit
from tests.support.s3_presigned import checked_moto_s3_server

FILES = {"model.tar.gz": b"\x1f\x8b pretend model " * 4000, "report.json": b'{"summary": {"k_star": 2}}'}


def _succeeded_job(client: TestClient, auth: dict[str, str], settings: Settings, engine: Engine, tmp: Path) -> str:
    job_id = submit(client, auth, settings)
    start(engine, job_id)
    finish(engine, job_id, artifacts=store(settings, job_id, FILES, tmp))
    return job_id


def _manifest(client: TestClient, auth: dict[str, str], job_id: str) -> dict[str, dict[str, str]]:
    response = client.get(f"/v1/jobs/{job_id}/artifacts", headers=auth)
    assert response.status_code == 200, response.text
    return {entry["name"]: entry for entry in response.json()["data"]}


def test_a_signed_link_downloads_without_a_key_and_fails_once_changed(
    client: TestClient, auth: dict[str, str], settings: Settings, engine: Engine, tmp_path: Path
) -> None:
    job_id = _succeeded_job(client, auth, settings, engine, tmp_path / "files")
    manifest = _manifest(client, auth, job_id)
    link = manifest["model.tar.gz"]["signed_url"]
    # Absolute, on the address the caller used; it names the key's id (the link dies with the key), never the key.
    owner = key_id_of(auth["Authorization"].removeprefix("Bearer "))
    assert link.startswith(f"http://testserver/v1/artifacts/{job_id}/model.tar.gz?key={owner}&expires=")
    assert auth["Authorization"].split()[-1] not in link

    anonymous = client.get(link)  # no Authorization header
    assert anonymous.status_code == 200
    assert anonymous.content == FILES["model.tar.gz"]
    assert anonymous.headers["etag"] == f'"{manifest["model.tar.gz"]["sha256"]}"'
    assert anonymous.headers["cache-control"] == "private, no-store"
    ranged = client.get(link, headers={"Range": "bytes=10-19"})
    assert ranged.status_code == 206 and ranged.content == FILES["model.tar.gz"][10:20]

    parts = urlsplit(link)
    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
    forged_signature = query["signature"][:-1] + ("0" if query["signature"][-1] != "0" else "1")
    tampered = {
        "another artifact": f"/v1/artifacts/{job_id}/report.json?{parts.query}",
        "a later expiry": f"{parts.path}?{urlencode({**query, 'expires': int(query['expires']) + 3600})}",
        "another signature": f"{parts.path}?{urlencode({**query, 'signature': forged_signature})}",
        "another job": f"/v1/artifacts/{'0' * 32}/model.tar.gz?{parts.query}",
    }
    for what, url in tampered.items():
        refused = client.get(url)
        assert refused.status_code == 403, what
        assert refused.headers["content-type"] == "application/problem+json"
        assert refused.json()["code"] == "link_invalid", what
    # The key the links are signed with is kept private to the service.
    assert (settings.data_dir / KEY_FILE).stat().st_mode & 0o077 == 0


def test_a_signed_link_fails_after_its_expiry(
    client: TestClient, auth: dict[str, str], settings: Settings, engine: Engine, tmp_path: Path
) -> None:
    job_id = _succeeded_job(client, auth, settings, engine, tmp_path / "files")
    sha = _manifest(client, auth, job_id)["report.json"]["sha256"]
    artifact = ArtifactRef(name="report.json", sha256=sha, storage_key="unused")
    # A link made by this server two TTLs ago: genuine, and expired one TTL ago.
    owner = key_id_of(auth["Authorization"].removeprefix("Bearer "))
    old = local_link(settings, job_id=job_id, owner_id=owner, artifact=artifact, base_url=None,
                     now=time.time() - 2 * settings.signed_url_ttl_s)
    expired = client.get(old.url)
    assert expired.status_code == 403
    assert expired.json()["code"] == "link_expired"
    assert "expired at" in expired.json()["detail"] and f"/v1/jobs/{job_id}/artifacts" in expired.json()["detail"]
    fresh = local_link(settings, job_id=job_id, owner_id=owner, artifact=artifact, base_url=None)
    assert client.get(fresh.url).content == FILES["report.json"]


def test_deleting_the_job_revokes_its_links(
    client: TestClient, auth: dict[str, str], settings: Settings, engine: Engine, tmp_path: Path
) -> None:
    job_id = _succeeded_job(client, auth, settings, engine, tmp_path / "files")
    link = _manifest(client, auth, job_id)["report.json"]["signed_url"]
    assert client.get(link).status_code == 200
    assert client.delete(f"/v1/jobs/{job_id}", headers=auth).status_code == 204
    gone = client.get(link)
    assert gone.status_code == 403 and gone.json()["code"] == "link_invalid"


def test_links_are_off_with_a_zero_ttl_and_need_the_servers_key(tmp_path: Path) -> None:
    settings = service_settings(tmp_path, signed_url_ttl_s=0)
    engine = migrated_engine(settings)
    key = new_key(engine)
    auth = {"Authorization": f"Bearer {key}"}
    with TestClient(create_app(settings)) as client:
        job_id = _succeeded_job(client, auth, settings, engine, tmp_path / "files")
        entry = _manifest(client, auth, job_id)["report.json"]
        assert entry["signed_url"] is None and entry["signed_url_expires_at"] is None
        # A link signed with another key (another server's, or a guessed one) is refused.
        (tmp_path / "other").mkdir()
        other = service_settings(tmp_path / "other", signing_key="not-this-servers-key", signed_url_ttl_s=60)
        forged = local_link(other, job_id=job_id, owner_id=key_id_of(key),
                            artifact=ArtifactRef("report.json", entry["sha256"], "x"), base_url=None)
        assert client.get(forged.url).json()["code"] == "link_invalid"
    engine.dispose()


@pytest.fixture
def s3_endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with moto_s3_server() as endpoint:
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="cahp-artifacts")
        yield endpoint


def test_with_the_s3_store_links_are_presigned_urls_that_die_with_the_job(tmp_path: Path, s3_endpoint: str) -> None:
    settings = service_settings(tmp_path, artifact_store="s3://cahp-artifacts/team-a", s3_endpoint_url=s3_endpoint,
                                s3_region="us-east-1", allowed_outbound_hosts=("127.0.0.1",), signed_url_ttl_s=600)
    engine = migrated_engine(settings)
    auth = {"Authorization": f"Bearer {new_key(engine)}"}
    with TestClient(create_app(settings)) as client:
        job_id = _succeeded_job(client, auth, settings, engine, tmp_path / "files")
        entry = _manifest(client, auth, job_id)["model.tar.gz"]
        link = entry["signed_url"]
        query = parse_qs(urlsplit(link).query)
        assert link.startswith(f"{s3_endpoint}/cahp-artifacts/team-a/jobs/{job_id}/1/model.tar.gz?")
        assert query["X-Amz-Expires"] == ["600"] and "X-Amz-Signature" in query
        assert "testing" not in link.split("Credential=")[0]  # no secret in the URL, only the access key id
        # Fetched straight from the store, with no credentials at all.
        fetched = httpx.get(link)
        assert fetched.status_code == 200
        assert hashlib.sha256(fetched.content).hexdigest() == entry["sha256"]
        assert 'filename="model.tar.gz"' in fetched.headers["content-disposition"]
        assert client.delete(f"/v1/jobs/{job_id}", headers=auth).status_code == 204
        # The object is gone: S3 answers 403 (not 404) to a link that grants no listing of the bucket.
        assert httpx.get(link).status_code in (403, 404)
    engine.dispose()


def test_presigned_urls_name_the_public_endpoint_when_there_is_one(tmp_path: Path, s3_endpoint: str) -> None:
    public = "https://objects.example.com"
    settings = service_settings(tmp_path, artifact_store="s3://cahp-artifacts", s3_endpoint_url=s3_endpoint,
                                s3_region="us-east-1", allowed_outbound_hosts=("127.0.0.1",),
                                s3_public_endpoint_url=public)
    engine = migrated_engine(settings)
    auth = {"Authorization": f"Bearer {new_key(engine)}"}
    with TestClient(create_app(settings)) as client:
        job_id = _succeeded_job(client, auth, settings, engine, tmp_path / "files")
        link = _manifest(client, auth, job_id)["report.json"]["signed_url"]
    assert link.startswith(f"{public}/cahp-artifacts/jobs/{job_id}/1/report.json?")
    engine.dispose()


# moto's own server serves a presigned URL however it was changed and however old it is (it checks no
# query-string signature): these tests put S3's own check of a presigned request in front of it.
@pytest.fixture
def checked_s3_endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with checked_moto_s3_server({"testing": "testing"}) as endpoint:
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="cahp-artifacts")
        yield endpoint


def _s3_settings(tmp_path: Path, endpoint: str, ttl_s: int) -> Settings:
    return service_settings(tmp_path, artifact_store="s3://cahp-artifacts/team-a", s3_endpoint_url=endpoint,
                            s3_region="us-east-1", allowed_outbound_hosts=("127.0.0.1",), signed_url_ttl_s=ttl_s)


def _refusal(response: httpx.Response) -> str:
    """The S3 error code of a refused request."""
    assert response.status_code == 403, response.text
    code = response.text.partition("<Code>")[2].partition("</Code>")[0]
    assert code, response.text
    return code


def test_a_tampered_presigned_url_is_refused_by_the_store(tmp_path: Path, checked_s3_endpoint: str) -> None:
    settings = _s3_settings(tmp_path, checked_s3_endpoint, ttl_s=600)
    engine = migrated_engine(settings)
    auth = {"Authorization": f"Bearer {new_key(engine)}"}
    with TestClient(create_app(settings)) as client:
        job_id = _succeeded_job(client, auth, settings, engine, tmp_path / "files")
        manifest = _manifest(client, auth, job_id)
    engine.dispose()
    link = manifest["model.tar.gz"]["signed_url"]
    # The link as given is served, with no credentials: the check in front of the store lets it through.
    fetched = httpx.get(link)
    assert fetched.status_code == 200 and hashlib.sha256(fetched.content).hexdigest() == manifest["model.tar.gz"][
        "sha256"]
    signature = parse_qs(urlsplit(link).query)["X-Amz-Signature"][0]
    forged = signature[:-1] + ("0" if signature[-1] != "0" else "1")
    tampered = {
        "one character of the signature": link.replace(f"X-Amz-Signature={signature}", f"X-Amz-Signature={forged}"),
        "another object's key": link.replace("/model.tar.gz?", "/report.json?"),
        "one character of the key": link.replace("/model.tar.gz?", "/model.tar.gz_?"),
        "a longer life": link.replace("X-Amz-Expires=600", "X-Amz-Expires=6000"),
        "another file name": link.replace("model.tar.gz%22", "report.json%22"),
    }
    for what, url in tampered.items():
        assert url != link, what
        assert _refusal(httpx.get(url)) == "SignatureDoesNotMatch", what
    # The report.json object exists: only the signature made its key unreachable with model.tar.gz's link.
    assert httpx.get(manifest["report.json"]["signed_url"]).content == FILES["report.json"]


def test_a_presigned_url_is_refused_by_the_store_after_its_ttl(tmp_path: Path, checked_s3_endpoint: str) -> None:
    # A TTL with margin: the first GET must come before it ends, however busy the machine (a 1-s link
    # expired before its first GET on a loaded 2-core machine).
    ttl = 10
    settings = _s3_settings(tmp_path, checked_s3_endpoint, ttl_s=ttl)
    engine = migrated_engine(settings)
    auth = {"Authorization": f"Bearer {new_key(engine)}"}
    with TestClient(create_app(settings)) as client:
        job_id = _succeeded_job(client, auth, settings, engine, tmp_path / "files")
        entry = _manifest(client, auth, job_id)["report.json"]
    engine.dispose()
    link = entry["signed_url"]
    query = parse_qs(urlsplit(link).query)
    assert query["X-Amz-Expires"] == [str(ttl)]
    signed_at = dt.datetime.strptime(query["X-Amz-Date"][0], "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC)
    expires_at = dt.datetime.fromisoformat(entry["signed_url_expires_at"].replace("Z", "+00:00"))
    assert abs((expires_at - signed_at).total_seconds() - ttl) < 2  # the manifest says when the store stops serving it
    assert httpx.get(link).content == FILES["report.json"]
    # Past X-Amz-Date + the TTL (X-Amz-Date is to the second).
    time.sleep(max(0.0, signed_at.timestamp() + ttl + 1.2 - time.time()))
    assert _refusal(httpx.get(link)) == "AccessDenied"
    assert "Request has expired" in httpx.get(link).text
