"""Turning a job's model and dataset references into what ``run_pruning`` takes.

Hub references pass through as ids. Everything else becomes a local directory under the job's
scratch directory: uploads and ``s3://`` objects are downloaded, archives are unpacked safely
(:func:`app.core.inputs._archives.unpack`), and a single dataset split file (with its ``eval_uri`` partner) is
placed in a directory as ``{train_split}.csv`` and ``{eval_split}.csv`` (or .jsonl/.parquet).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from app.core.db import transaction
from app.core.errors import InvalidReferenceError
from app.core.inputs._archives import unpack
from app.core.inputs.sources import (
    Reference,
    Role,
    SourceContext,
    UploadInfo,
    fetch_reference,
    find_upload,
    parse_reference,
)
from app.core.settings import Settings
from app.core.storage import ArtifactStore
from cahp_engine.data import check_split_name
from cahp_engine.errors import UnsupportedModelError

DEFAULT_EVAL_SPLIT = "test"
#: Files whose ``auto_map`` would name code shipped with the model.
CODE_CONFIGS = ("config.json", "tokenizer_config.json", "processor_config.json")


@dataclass(frozen=True)
class LocalInputs:
    """Arguments for ``run_pruning``: local directories or hub ids."""

    model_ref: str
    dataset_ref: str


@dataclass
class InputFetcher:
    """Fetches one job's references into ``workdir`` through the sources (:mod:`app.core.inputs.sources`)."""

    settings: Settings
    sessions: sessionmaker[Session]
    store: ArtifactStore
    owner_id: str
    workdir: Path
    context: SourceContext = field(init=False)

    def __post_init__(self) -> None:
        self.context = SourceContext(settings=self.settings, owner_id=self.owner_id, find_upload=self._find_upload,
                                     store=self.store)

    def _find_upload(self, upload_id: str) -> UploadInfo | None:
        with transaction(self.sessions) as session:
            return find_upload(session, upload_id=upload_id, owner_id=self.owner_id)

    def prepare(self, *, model: dict[str, Any], dataset: dict[str, Any]) -> LocalInputs:
        self.workdir.mkdir(parents=True, exist_ok=True)
        model_ref = self._as_directory(parse_reference(model["uri"], role="model"), "model", "model")
        data = parse_reference(dataset["uri"], role="dataset")
        eval_uri = dataset.get("eval_uri")
        if eval_uri is None:
            dataset_ref = self._as_directory(data, "dataset", "dataset")
        else:
            dataset_ref = self._split_files(data, parse_reference(eval_uri, role="dataset"), dataset)
        return LocalInputs(model_ref=model_ref, dataset_ref=dataset_ref)

    def _as_directory(self, ref: Reference, role: Role, name: str) -> str:
        """A hub id, or a local directory holding the model or dataset."""
        fetched = fetch_reference(ref, dest=self.workdir / f"{name}.src", context=self.context)
        if fetched.shape == "archive":
            root = unpack(fetched.local, self.workdir / name, max_bytes=self.settings.max_unpacked_bytes,
                          max_members=self.settings.max_archive_members)
            return str(root)
        if fetched.shape == "file":
            raise InvalidReferenceError(
                f"{ref.uri} is a single file; a {role} needs a directory or archive"
                + ("" if role == "model" else ", or a second file as `eval_uri`")
            )
        return fetched.path

    def _split_files(self, train: Reference, evaluation: Reference, options: dict[str, Any]) -> str:
        target = self.workdir / "dataset"
        target.mkdir()
        # Checked at submit too; checked again here because the name becomes a file name.
        splits = ((train, check_split_name("train_split", options.get("train_split") or "train")),
                  (evaluation, check_split_name("eval_split", options.get("eval_split") or DEFAULT_EVAL_SPLIT)))
        for i, (ref, split) in enumerate(splits):
            if ref.scheme == "hf":
                raise InvalidReferenceError(f"{ref.uri}: `uri` and `eval_uri` must both be single files")
            fetched = fetch_reference(ref, dest=self.workdir / f"split{i}.src", context=self.context)
            if fetched.shape != "file":
                raise InvalidReferenceError(
                    f"{ref.uri} is not a single split file; with `eval_uri`, both URIs name one .csv, .jsonl or "
                    ".parquet file each"
                )
            destination = target / f"{split}{_data_suffix(fetched.local.name)}"
            if destination.parent != target:  # unreachable with a checked name; never write elsewhere
                raise InvalidReferenceError(f"split name {split!r} cannot be used as a file name")
            shutil.copyfile(fetched.local, destination)
        return str(target)


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
    refuse_code_configs(lambda name: (directory / name).read_text(encoding="utf-8")
                        if (directory / name).is_file() else None)


def refuse_code_configs(read: Callable[[str], str | None]) -> None:
    """:func:`refuse_custom_code` over ``read(name)``: a top-level file's text, or None where there is none."""
    for name in CODE_CONFIGS:
        try:
            text = read(name)
            if text is None:
                continue
            config = json.loads(text)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            continue  # the engine reports an unreadable (or too deeply nested) config with its own message
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
