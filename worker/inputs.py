"""Turning a job's model and dataset references into what ``run_pruning`` takes.

Hub references pass through as ids. Everything else becomes a local directory under the job's
scratch directory: uploads and ``s3://`` objects are downloaded, archives are unpacked safely
(:func:`app.archives.unpack`), and a single dataset split file (with its ``eval_uri`` partner) is
placed in a directory as ``{train_split}.csv`` and ``{eval_split}.csv`` (or .jsonl/.parquet).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from app import repository
from app.archives import archive_suffix, unpack
from app.db import transaction
from app.errors import InvalidReferenceError, NotFoundError
from app.outbound import check_hub_endpoint
from app.references import (
    Reference,
    Role,
    Shape,
    check_s3_reference,
    parse_reference,
    resolve_local,
    shape_of_name,
)
from app.settings import Settings
from app.storage import ArtifactStore, download_s3_object
from cahp_engine.datasets_io import check_split_name
from cahp_engine.errors import UnsupportedModelError

DEFAULT_EVAL_SPLIT = "test"
#: Files whose ``auto_map`` would name code shipped with the model.
_CODE_CONFIGS = ("config.json", "tokenizer_config.json", "processor_config.json")


@dataclass(frozen=True)
class Inputs:
    """Arguments for ``run_pruning``: local directories or hub ids."""

    model_ref: str
    dataset_ref: str


@dataclass
class InputFetcher:
    """Fetches references for one job into ``workdir``; the S3 client is made on first use."""

    settings: Settings
    sessions: sessionmaker[Session]
    store: ArtifactStore
    owner_id: str
    workdir: Path
    s3_client: Any = None

    def prepare(self, *, model: dict[str, Any], dataset: dict[str, Any]) -> Inputs:
        self.workdir.mkdir(parents=True, exist_ok=True)
        model_ref = self._as_directory(parse_reference(model["uri"], role="model"), "model", "model")
        data = parse_reference(dataset["uri"], role="dataset")
        eval_uri = dataset.get("eval_uri")
        if eval_uri is None:
            dataset_ref = self._as_directory(data, "dataset", "dataset")
        else:
            dataset_ref = self._split_files(data, parse_reference(eval_uri, role="dataset"), dataset)
        return Inputs(model_ref=model_ref, dataset_ref=dataset_ref)

    # --- shapes ------------------------------------------------------------------------------------

    def _as_directory(self, ref: Reference, role: Role, name: str) -> str:
        """A hub id, or a local directory holding the model or dataset."""
        if ref.scheme == "hf":
            check_hub_endpoint(allowed_hosts=self.settings.allowed_outbound_hosts)
            return ref.target
        local, shape = self._fetch(ref, self.workdir / f"{name}.src")
        if shape == "archive":
            root = unpack(local, self.workdir / name, max_bytes=self.settings.max_unpacked_bytes,
                          max_members=self.settings.max_archive_members)
            return str(root)
        if shape == "file":
            raise InvalidReferenceError(
                f"{ref.uri} is a single file; a {role} needs a directory or archive"
                + ("" if role == "model" else ", or a second file as `eval_uri`")
            )
        return str(local)

    def _split_files(self, train: Reference, evaluation: Reference, options: dict[str, Any]) -> str:
        target = self.workdir / "dataset"
        target.mkdir()
        # Checked at submit too; checked again here because the name becomes a file name.
        splits = ((train, check_split_name("train_split", options.get("train_split") or "train")),
                  (evaluation, check_split_name("eval_split", options.get("eval_split") or DEFAULT_EVAL_SPLIT)))
        for i, (ref, split) in enumerate(splits):
            if ref.scheme == "hf":
                raise InvalidReferenceError(f"{ref.uri}: `uri` and `eval_uri` must both be single files")
            local, shape = self._fetch(ref, self.workdir / f"split{i}.src")
            if shape != "file":
                raise InvalidReferenceError(
                    f"{ref.uri} is not a single split file; with `eval_uri`, both URIs name one .csv, .jsonl or "
                    ".parquet file each"
                )
            destination = target / f"{split}{_data_suffix(local.name)}"
            if destination.parent != target:  # unreachable with a checked name; never write elsewhere
                raise InvalidReferenceError(f"split name {split!r} cannot be used as a file name")
            shutil.copyfile(local, destination)
        return str(target)

    # --- fetching ----------------------------------------------------------------------------------

    def _fetch(self, ref: Reference, dest: Path) -> tuple[Path, Shape]:
        """A local path for a non-hub reference, and what it holds."""
        if ref.scheme == "file":
            path = resolve_local(ref.target, self.settings)
            return path, "directory" if path.is_dir() else shape_of_name(path.name)
        if ref.scheme == "upload":
            with transaction(self.sessions) as session:
                upload = repository.get_upload(session, upload_id=ref.target, owner_id=self.owner_id)
            if upload is None:
                raise InvalidReferenceError(f"{ref.uri} no longer exists; upload the file again")
            local = dest.with_name(dest.name + upload.suffix)
            try:
                self.store.download(upload.storage_key, local)
            except NotFoundError as exc:
                raise InvalidReferenceError(f"{ref.uri}: the uploaded file is missing from the store") from exc
            return local, "archive" if upload.kind == "archive" else "file"
        return self._fetch_s3(ref, dest)

    def _fetch_s3(self, ref: Reference, dest: Path) -> tuple[Path, Shape]:
        # Checked at submit too; checked again because the operator's settings may have changed.
        bucket, key = check_s3_reference(ref, self.settings)
        if self.s3_client is None:
            from app.storage import make_s3_client

            self.s3_client = make_s3_client(self.settings)
        shape = shape_of_name(key)
        if shape != "directory":
            local = dest.with_name(dest.name + (archive_suffix(key) or PurePosixPath(key).suffix))
            try:
                download_s3_object(self.s3_client, bucket, key, local)
            except NotFoundError as exc:
                raise InvalidReferenceError(str(exc)) from exc
            return local, shape
        return self._fetch_s3_prefix(ref, bucket, key.rstrip("/") + "/", dest), "directory"

    def _fetch_s3_prefix(self, ref: Reference, bucket: str, prefix: str, dest: Path) -> Path:
        """Download every object under ``prefix`` (a model or dataset stored as loose files)."""
        budget, count = self.settings.max_unpacked_bytes, 0
        paginator = self.s3_client.get_paginator("list_objects_v2")
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
                if budget < 0 or count > self.settings.max_archive_members:
                    raise InvalidReferenceError(
                        f"{ref.uri} holds more than {self.settings.max_unpacked_bytes} bytes or "
                        f"{self.settings.max_archive_members} objects; point at a smaller prefix"
                    )
                target = dest.joinpath(*parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                download_s3_object(self.s3_client, bucket, obj["Key"], target)
        if count == 0:
            raise InvalidReferenceError(f"{ref.uri} matches no object and no key prefix in bucket {bucket!r}")
        return dest


def refuse_custom_code(directory: Path) -> None:
    """Refuse a model directory whose configuration asks for code shipped with the model.

    The engine loads with ``trust_remote_code=False``, under which transformers ignores such code
    for the architectures it knows; refusing outright says plainly that it will never run, rather
    than loading something other than what the model's author meant.

    Raises
    ------
    UnsupportedModelError
        When ``config.json`` (or a tokenizer or processor config) has an ``auto_map`` entry.
    """
    for name in _CODE_CONFIGS:
        path = directory / name
        if not path.is_file():
            continue
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue  # the engine reports an unreadable config with its own message
        if isinstance(config, dict) and config.get("auto_map"):
            modules = sorted({str(v).split(".")[0] for v in _flatten(config["auto_map"])})
            raise UnsupportedModelError(
                f"the model's {name} names custom code ({', '.join(modules) or 'auto_map'}); cahp never runs "
                "code shipped with a model. Use a model whose architecture transformers provides (bert, roberta, "
                "xlm-roberta, electra, distilbert) and remove `auto_map` from its configuration"
            )


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [item for v in value.values() for item in _flatten(v)]
    if isinstance(value, list | tuple):
        return [item for v in value for item in _flatten(v)]
    return [value]


def _data_suffix(name: str) -> str:
    return PurePosixPath(name.lower()).suffix
