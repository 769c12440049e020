"""``s3://bucket/key``: an object (archive or split file) or a key prefix of loose files.

Readable only under ``CAHP_ALLOWED_S3_PREFIXES`` (none by default) and never inside the artifact
store's own bucket and prefix, which holds every key's uploads and results. The S3 endpoint and
credentials are the artifact store's settings. At submit, a dataset's cards (``README.md``,
``.huggingface.yaml``, under the prefix or at the root of the archive) are read and checked as the
engine checks them (:mod:`app.core.inputs._dataset_checks`); an object that cannot be read yet is left to
the worker, which checks it when the job runs.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

from app.core.errors import InvalidReferenceError, ResourceNotFoundError
from app.core.inputs._archives import archive_suffix
from app.core.inputs._dataset_checks import MAX_CARD_BYTES, check_card_bytes, check_dataset_archive, ranged_file
from app.core.inputs.sources._base import Fetched, Reference, Role, Shape, SourceContext, shape_of_name
from app.core.settings import Settings
from app.core.storage import download_s3_object, make_s3_client

SCHEME = "s3"
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


def parse(uri: str, rest: str, *, role: Role) -> Reference:
    bucket, _, key = rest.partition("/")
    if not _BUCKET.fullmatch(bucket) or not key:
        raise InvalidReferenceError(f"{uri!r} must be s3://bucket/key with a valid bucket name and a key")
    if any(part in ("", ".", "..") for part in key.rstrip("/").split("/")):
        raise InvalidReferenceError(f"{uri!r} has an empty, '.' or '..' part in its key; name the object plainly")
    return Reference(uri, SCHEME, rest)


def check(ref: Reference, *, role: Role, context: SourceContext) -> Shape:
    check_s3_reference(ref, context.settings)
    shape = shape_of_name(ref.target)
    if role == "dataset" and shape in ("directory", "archive"):
        _check_dataset(ref, shape, context)
    return shape


def _check_dataset(ref: Reference, shape: Shape, context: SourceContext) -> None:
    from botocore.exceptions import BotoCoreError, ClientError

    from cahp_engine.data import CARD_FILES

    bucket, _, key = ref.target.partition("/")
    client = context.cache.get("s3")
    if client is None:
        client = context.cache["s3"] = make_s3_client(context.settings)
    try:
        if shape == "directory":
            for name in CARD_FILES:
                try:
                    body = client.get_object(Bucket=bucket, Key=f"{key.rstrip('/')}/{name}",
                                             Range=f"bytes=0-{MAX_CARD_BYTES}")["Body"].read()
                except ClientError:
                    continue  # no such card
                if len(body) <= MAX_CARD_BYTES:
                    check_card_bytes(name, body, shown=ref.uri)
            return
        size = int(client.head_object(Bucket=bucket, Key=key)["ContentLength"])

        def read_range(start: int, end: int) -> bytes:
            body: bytes = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end}")["Body"].read()
            return body

        with ranged_file(read_range, size) as archive:
            check_dataset_archive(archive, shown=ref.uri, max_members=context.settings.max_archive_members)
    except (BotoCoreError, ClientError):
        return  # not readable now; the worker fetches it and the engine checks it then


def fetch(ref: Reference, *, dest: Path, context: SourceContext) -> Fetched:
    # Checked at submit too; checked again because the operator's settings may have changed.
    settings = context.settings
    bucket, key = check_s3_reference(ref, settings)
    client = context.cache.get("s3")
    if client is None:
        client = context.cache["s3"] = make_s3_client(settings)
    shape = shape_of_name(key)
    if shape != "directory":
        local = dest.with_name(dest.name + (archive_suffix(key) or PurePosixPath(key).suffix))
        try:
            download_s3_object(client, bucket, key, local)
        except ResourceNotFoundError as exc:
            raise InvalidReferenceError(str(exc)) from exc
        return Fetched(str(local), shape)
    _download_prefix(client, ref, bucket, key.rstrip("/") + "/", dest, settings)
    return Fetched(str(dest), "directory")


def _download_prefix(client: object, ref: Reference, bucket: str, prefix: str, dest: Path, settings: Settings) -> None:
    """Download every object under ``prefix`` (a model or dataset stored as loose files)."""
    budget, count = settings.max_unpacked_bytes, 0
    paginator = client.get_paginator("list_objects_v2")  # type: ignore[attr-defined]
    for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            relative = obj["Key"][len(prefix):]
            parts = relative.split("/")
            if not relative or relative.endswith("/"):
                continue
            if any(p in ("", ".", "..") for p in parts):
                raise InvalidReferenceError(f"{ref.uri}: object key {obj['Key']!r} is not a safe file name")
            budget -= int(obj.get("Size", 0))
            count += 1
            if budget < 0 or count > settings.max_archive_members:
                raise InvalidReferenceError(
                    f"{ref.uri} holds more than {settings.max_unpacked_bytes} bytes or "
                    f"{settings.max_archive_members} objects; point at a smaller prefix"
                )
            target = dest.joinpath(*parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            download_s3_object(client, bucket, obj["Key"], target)
    if count == 0:
        raise InvalidReferenceError(f"{ref.uri} matches no object and no key prefix in bucket {bucket!r}")


def check_s3_reference(ref: Reference, settings: Settings) -> tuple[str, str]:
    """``(bucket, key)`` of an ``s3://`` reference this server may read, else InvalidReferenceError.

    Readable: under one of ``CAHP_ALLOWED_S3_PREFIXES`` (empty: no ``s3://`` inputs at all) and
    not inside the artifact store's own bucket and prefix, which holds every key's uploads and
    results.
    """
    bucket, _, key = ref.target.partition("/")
    if not settings.allowed_s3_prefixes:
        raise InvalidReferenceError(
            f"{ref.uri}: s3:// references are disabled on this server; an operator can allow buckets or prefixes "
            "with CAHP_ALLOWED_S3_PREFIXES, or upload the files with POST /v1/uploads"
        )
    store = settings.resolved_artifact_store
    if store.startswith("s3://"):
        store_bucket, _, store_prefix = store[len("s3://"):].partition("/")
        if bucket == store_bucket and _key_under(key, store_prefix):
            raise InvalidReferenceError(
                f"{ref.uri} names the artifact store's own objects, which no job may read; reference a file "
                "in your own bucket, or upload it with POST /v1/uploads"
            )
    for allowed in settings.allowed_s3_prefixes:
        allowed_bucket, _, allowed_prefix = allowed.partition("/")
        if bucket == allowed_bucket and _key_under(key, allowed_prefix):
            return bucket, key
    raise InvalidReferenceError(
        f"{ref.uri} is not under a bucket or prefix this server may read; ask the operator which ones "
        "CAHP_ALLOWED_S3_PREFIXES allows, or upload the files with POST /v1/uploads"
    )


def _key_under(key: str, prefix: str) -> bool:
    """Whether ``key`` is ``prefix`` or below it, as a directory (``a/b`` is not under ``a/bc``)."""
    prefix = prefix.strip("/")
    return not prefix or key.rstrip("/") == prefix or key.startswith(prefix + "/")
