"""Where artifacts and uploads are kept: a local directory or an S3-compatible bucket.

Both stores make a write visible only when it is complete: the local store writes a temporary file
and renames it, and S3 shows an object only once its PUT (or multipart upload) has finished. The
database row that points at an object is written after the object, so the API never serves a
half-written artifact.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from app.core.errors import InvalidRequestError, ResourceNotFoundError, UnavailableError
from app.core.settings import Settings

CHUNK_SIZE = 1024 * 1024
#: Media types of stored artifacts, by suffix; anything else is application/octet-stream.
ARTIFACT_MEDIA_TYPES = {".json": "application/json", ".png": "image/png", ".gz": "application/gzip",
                        ".csv": "text/csv", ".txt": "text/plain"}


class ArtifactStore(Protocol):
    """Objects under ``/``-separated keys such as ``jobs/<id>/1/report.json``."""

    def put_file(self, key: str, path: Path, *, media_type: str) -> None:
        """Store the file at ``path`` under ``key``, replacing any object there, all at once."""

    def iter_bytes(self, key: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        """Open the object now (ResourceNotFoundError if there is none) and stream its bytes ``start..end``.

        ``end`` is inclusive, as in an HTTP ``Range``; None means to the end of the object.
        """

    def download(self, key: str, dest: Path) -> None:
        """Copy the object into the file ``dest``."""

    def exists(self, key: str) -> bool: ...

    def delete(self, key: str) -> None: ...

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object whose key starts with ``prefix/``; returns how many there were."""

    def presigned_url(self, key: str, *, expires_s: int, filename: str) -> str | None:
        """A URL that reads the object without credentials for ``expires_s`` seconds, or None when the
        store cannot make one (the API then signs its own links: :mod:`app.core.security._signing`)."""


def job_prefix(job_id: str) -> str:
    """Where every attempt of a job stores its artifacts: ``jobs/<id>/<attempt>/<name>``."""
    return f"jobs/{job_id}"


def resume_prefix(job_id: str) -> str:
    """Where a running job keeps its resume state (inside its own prefix: deleting the job deletes it).

    The folder keeps its old name, ``checkpoints/``, so that a job saved by an earlier release is still found.
    """
    return f"{job_prefix(job_id)}/checkpoints"


def _check_key(key: str) -> str:
    parts = PurePosixPath(key).parts
    if not parts or key.startswith("/") or any(p in ("", ".", "..") for p in key.split("/")):
        raise ValueError(f"invalid storage key {key!r}")
    return key


class LocalStore:
    """A directory on a local or shared filesystem."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, key: str) -> Path:
        return self.root / _check_key(key)

    def put_file(self, key: str, path: Path, *, media_type: str) -> None:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{uuid.uuid4().hex}.partial")
        try:
            shutil.copyfile(path, partial)
            os.replace(partial, target)  # atomic on one filesystem
        finally:
            partial.unlink(missing_ok=True)

    def iter_bytes(self, key: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        try:
            handle = open(self._path(key), "rb")
        except FileNotFoundError as exc:
            raise ResourceNotFoundError(f"stored object {key!r} is missing") from exc
        handle.seek(start)
        return _chunks(handle, None if end is None else end + 1 - start)

    def download(self, key: str, dest: Path) -> None:
        try:
            shutil.copyfile(self._path(key), dest)
        except FileNotFoundError as exc:
            raise ResourceNotFoundError(f"stored object {key!r} is missing") from exc

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def delete_prefix(self, prefix: str) -> int:
        root = self._path(prefix.strip("/"))
        if not root.is_dir():
            return 0
        count = sum(1 for path in root.rglob("*") if path.is_file())
        shutil.rmtree(root, ignore_errors=True)
        return count

    def presigned_url(self, key: str, *, expires_s: int, filename: str) -> str | None:
        return None  # a directory has no URLs of its own: the API serves signed /v1/artifacts/... links


class S3Store:
    """A bucket (and key prefix) in any S3-compatible service: AWS, MinIO, Ceph, moto.

    ``signer`` makes presigned URLs (a client of the endpoint deployers reach, when it differs from
    the one the service uses; signing is local, it sends nothing).
    """

    def __init__(self, client: Any, bucket: str, prefix: str = "", *, signer: Any = None) -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.signer = signer if signer is not None else client

    def _key(self, key: str) -> str:
        _check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def put_file(self, key: str, path: Path, *, media_type: str) -> None:
        self.client.upload_file(str(path), self.bucket, self._key(key), ExtraArgs={"ContentType": media_type})

    def iter_bytes(self, key: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        from botocore.exceptions import ClientError

        extra = {} if start == 0 and end is None else {"Range": f"bytes={start}-{'' if end is None else end}"}
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self._key(key), **extra)
        except ClientError as exc:
            if _missing(exc):
                raise ResourceNotFoundError(f"stored object {key!r} is missing") from exc
            raise UnavailableError(f"the artifact store refused a read: {exc}") from exc
        return _chunks(response["Body"])

    def download(self, key: str, dest: Path) -> None:
        download_s3_object(self.client, self.bucket, self._key(key), dest)

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as exc:
            if _missing(exc):
                return False
            raise
        return True

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(key))

    def delete_prefix(self, prefix: str) -> int:
        full = self._key(prefix.strip("/")) + "/"
        count = 0
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full):
            keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
            if keys:
                self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": keys, "Quiet": True})
                count += len(keys)
        return count

    def presigned_url(self, key: str, *, expires_s: int, filename: str) -> str | None:
        # The download names itself, as GET /v1/jobs/{id}/artifacts/{name} does.
        params = {"Bucket": self.bucket, "Key": self._key(key),
                  "ResponseContentDisposition": f'attachment; filename="{filename}"'}
        url: str = self.signer.generate_presigned_url("get_object", Params=params, ExpiresIn=int(expires_s))
        return url


def _chunks(handle: Any, length: int | None = None) -> Iterator[bytes]:
    """Read an open file-like object in chunks, to the end or ``length`` bytes, closing it afterwards."""
    try:
        left = length
        while left is None or left > 0:
            chunk = handle.read(CHUNK_SIZE if left is None else min(CHUNK_SIZE, left))
            if not chunk:
                break
            if left is not None:
                left -= len(chunk)
            yield chunk
    finally:
        handle.close()


def _missing(exc: Any) -> bool:
    return str(exc.response.get("Error", {}).get("Code")) in ("404", "NoSuchKey", "NotFound", "NoSuchBucket")


def download_s3_object(client: Any, bucket: str, key: str, dest: Path) -> None:
    """Download one object, mapping a missing one to a message about the reference."""
    from botocore.exceptions import ClientError

    try:
        client.download_file(bucket, key, str(dest))
    except ClientError as exc:
        if _missing(exc):
            raise ResourceNotFoundError(f"s3://{bucket}/{key} does not exist") from exc
        raise


def make_s3_client(settings: Settings, *, endpoint_url: str | None = None) -> Any:
    """A boto3 S3 client for the configured endpoint (or ``endpoint_url``); credentials come from
    boto3's usual chain.

    Raises
    ------
    OutboundUrlRefusedError
        When the endpoint leads to a loopback, link-local or metadata address that
        ``CAHP_ALLOWED_OUTBOUND_HOSTS`` does not allow (:mod:`app.core.security._outbound`).
    """
    import boto3
    from botocore.config import Config

    from app.core.security import check_outbound_url

    endpoint = endpoint_url or settings.s3_endpoint_url
    if endpoint_url is None and settings.s3_endpoint_url is not None:
        check_outbound_url(settings.s3_endpoint_url, allowed_hosts=settings.allowed_outbound_hosts,
                           what="CAHP_S3_ENDPOINT_URL")

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=settings.s3_region,
        # Path-style addressing for self-hosted endpoints, whose DNS rarely resolves bucket subdomains.
        config=Config(
            retries={"max_attempts": 3, "mode": "standard"},
            s3={"addressing_style": "path" if endpoint else "auto"},
            # Presigned URLs in the current scheme (SigV4), which every S3-compatible store accepts.
            signature_version="s3v4",
        ),
    )


def split_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/some/key`` -> ``("bucket", "some/key")``."""
    if not uri.startswith("s3://"):
        raise InvalidRequestError(f"{uri!r} is not an s3:// URI")
    bucket, _, key = uri[len("s3://"):].partition("/")
    return bucket, key


def open_store(settings: Settings) -> ArtifactStore:
    """The store ``CAHP_ARTIFACT_STORE`` names (default: ``CAHP_DATA_DIR/artifacts``)."""
    location = settings.resolved_artifact_store
    if location.startswith("s3://"):
        bucket, prefix = split_s3_uri(location)
        public = settings.s3_public_endpoint_url
        # The public endpoint is only written into URLs, never connected to: no outbound check.
        signer = make_s3_client(settings, endpoint_url=public) if public else None
        return S3Store(make_s3_client(settings), bucket, prefix, signer=signer)
    return LocalStore(Path(location).expanduser().absolute())
