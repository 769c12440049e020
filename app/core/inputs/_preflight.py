"""Checking a job at submit with the worker's own checks, before it waits in the queue.

What can be known without building the model or reading a weight is checked here, in the order and
with the words of the worker (the engine's functions, on what was recorded of each upload when it
arrived, :mod:`app.core.inputs._upload_contents`, or on the files of a ``file://`` directory):

* the model: no code shipped with it (``auto_map``), safetensors weights only, named by a clean index
  and all present, a ``config.json`` that is a JSON object of a supported family, readable safetensors
  headers, and a config that declares no more layers than its weights hold;
* the dataset: the splits exist (train, and the evaluation split asked for or found), the text,
  pair and label columns exist, the labels make at least two classes that the evaluation split shares,
  no label or text is missing, and no split has more rows than ``CAHP_MAX_DATASET_ROWS``.

``hf://`` and ``s3://`` references, archives the API cannot read, and dataset formats other than
split files (``save_to_disk``, a repository layout) are left to the worker: the report says so. The
model is never built here (no torch in the API process): whether every tensor fits the architecture
is the worker's first check.
"""

from __future__ import annotations

import math
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core.errors import InvalidReferenceError, ModelTooLargeError
from app.core.inputs._archives import check_archive
from app.core.inputs._dataset_checks import check_dataset_directory
from app.core.inputs._local import refuse_code_configs
from app.core.inputs._upload_contents import (
    CONTENTS_VERSION,
    MAX_SMALL_FILE,
    SMALL_FILES,
    SPLIT_PLACEHOLDER,
    index_archive,
    index_upload,
    relabel,
)
from app.core.inputs.sources import (
    Reference,
    SourceContext,
    check_reference,
    check_revision,
    parse_reference,
    resolve_local,
)
from app.core.params import dataset_options
from app.core.settings import BYTES_PER_PARAMETER, Settings
from cahp_engine.data import DatasetOptions, DatasetProfile, SplitProfile, profile_directory
from cahp_engine.errors import ModelLoadError
from cahp_engine.models import ModelFiles, check_declarations, get_adapter, safetensors_header


@dataclass(frozen=True)
class PreflightReport:
    """What submit checked (``checked``) and what it left to the worker, with why (``skipped``)."""

    checked: tuple[str, ...]
    skipped: tuple[str, ...]


def check_inputs(*, model: dict[str, Any], dataset: dict[str, Any], context: SourceContext) -> PreflightReport:
    """Every check of a job's ``model`` and ``dataset`` records that reads what they name, then :func:`preflight`.

    Runs in the inspection sandbox (:mod:`app.core.sandbox`): it reads uploaded and referenced files.

    Raises
    ------
    InvalidReferenceError, DatasetError, ModelLoadError, UnsupportedModelError, ModelTooLargeError
        What to change, in the words the worker would use.
    """
    options = dataset_options(dataset)
    dataset_ref, eval_ref = _dataset_references(dataset, context)
    model_ref = parse_reference(model["uri"], role="model")
    check_reference(model_ref, role="model", context=context)
    revision = model.get("revision")
    if revision is not None and model_ref.scheme != "hf":
        raise InvalidReferenceError("`model.revision` applies only to hf:// models; remove it")
    if revision is not None:
        check_revision(revision, field="model.revision")
    return preflight(model=model_ref, dataset=dataset_ref, eval_dataset=eval_ref, options=options, context=context)


def _dataset_references(dataset: dict[str, Any], context: SourceContext) -> tuple[Reference, Reference | None]:
    ref = parse_reference(dataset["uri"], role="dataset")
    shape = check_reference(ref, role="dataset", context=context)
    eval_uri = dataset.get("eval_uri")
    if eval_uri is None:
        if shape == "file":
            raise InvalidReferenceError(
                f"{dataset['uri']} is a single file, which holds one split; give the evaluation split as "
                "`dataset.eval_uri`, or upload an archive holding train and test files"
            )
        return ref, None
    if shape != "file":
        raise InvalidReferenceError("`dataset.eval_uri` applies only when `dataset.uri` is a single split file")
    eval_ref = parse_reference(eval_uri, role="dataset")
    if check_reference(eval_ref, role="dataset", context=context) != "file":
        raise InvalidReferenceError(f"`dataset.eval_uri` ({eval_uri}) must be a single split file")
    return ref, eval_ref


def check_directories(*, model: Path | None, dataset: Path | None, options: DatasetOptions, settings: Settings
                      ) -> PreflightReport:
    """The submit checks again on the directories a worker fetched and unpacked, before the engine loads them.

    The worker runs this in its inspection sandbox, so a hostile header, config, card or split file
    costs a bounded child rather than the worker; the model's size is left to the engine's own
    count on the ``meta`` device, which is exact.
    """
    checked: list[str] = []
    files = None
    if model is not None:
        files = _from_directory(model)
        refuse_code_configs(lambda name: files.texts.get(name) if name in files.names else None)
        files.listing.check()
    if dataset is not None:
        check_dataset_directory(dataset, shown=str(dataset))
        profile = profile_directory(dataset, max_rows=settings.max_dataset_rows)
        profile.check(options, str(dataset))
        checked.append(f"dataset: splits {options.train_split!r} and the evaluation split, columns, labels, texts")
    if files is not None:
        checked.append(_check_model(files, settings, size=False))
    return PreflightReport(checked=tuple(checked), skipped=())


def check_model_size(parameters: int, settings: Settings, *, where: str) -> None:
    """Refuse a model of more parameters than :attr:`Settings.model_params_limit`, with the memory it needs.

    Raises
    ------
    ModelTooLargeError
        "needs about 38 GB; this worker has 24", and the setting that changes the limit.
    """
    limit = settings.model_params_limit
    if parameters <= limit:
        return
    need = parameters * BYTES_PER_PARAMETER / 1e9
    has = settings.resolved_worker_memory_bytes / 1e9
    if settings.max_model_params is not None:
        why = f"more than the limit of {limit:,} parameters (CAHP_MAX_MODEL_PARAMS)"
    else:
        why = (f"more than the {limit:,} this worker's memory holds at about {BYTES_PER_PARAMETER} bytes per "
               "parameter (the limit is derived from CAHP_WORKER_MEMORY_BYTES; CAHP_MAX_MODEL_PARAMS overrides it)")
    raise ModelTooLargeError(
        f"{where} holds {parameters:,} parameters, {why}: a job on it needs about {need:.0f} GB; this worker has "
        f"{has:.0f}. Use a smaller model, or a worker with more memory"
    )


def preflight(*, model: Reference, dataset: Reference, eval_dataset: Reference | None, options: DatasetOptions,
              context: SourceContext) -> PreflightReport:
    """Raise what the worker would raise first for this job's inputs, as far as submit can tell.

    Raises
    ------
    DatasetError, ModelLoadError, UnsupportedModelError
        With the worker's message (paths as its log shows them: ``<model>/...``, ``<dataset>/...``).
    """
    checked: list[str] = []
    skipped: list[str] = []
    files = _model_files(model, context, skipped)
    if files is not None:
        refuse_code_configs(lambda name: files.texts.get(name) if name in files.names else None)
        files.listing.check()  # the worker's first look at a model directory: no pickle, a clean index
    profile, where = _dataset(dataset, eval_dataset, options, context, skipped)
    if profile is not None:
        profile.check(options, where)
        checked.append(f"dataset: splits {options.train_split!r} and the evaluation split, columns, labels, texts")
    if files is not None:
        checked.append(_check_model(files, context.settings))
    return PreflightReport(checked=tuple(checked), skipped=tuple(skipped))


@dataclass(frozen=True)
class _Model:
    listing: ModelFiles
    texts: dict[str, str]
    headers: dict[str, dict[str, Any]]

    @property
    def names(self) -> frozenset[str]:
        return self.listing.names


def _check_model(files: _Model, settings: Settings, *, size: bool = True) -> str:
    raw = files.listing.config()
    adapter = get_adapter(types.SimpleNamespace(model_type=raw.get("model_type")))
    if "cahp" in raw:
        return f"model: a pruned {adapter.family} classifier"
    shapes: dict[str, tuple[int, ...]] = {}
    for name in files.listing.weights():
        header = files.headers.get(name)
        if header is None:
            return f"model: {adapter.family} config; weights left to the worker"
        if "error" in header:
            raise ModelLoadError(str(header["error"]))
        shapes.update({key: tuple(shape) for key, shape in header["shapes"].items()})
    check_declarations(raw, adapter, shapes, ref=files.listing.where)
    if size:
        check_model_size(sum(math.prod(shape) for shape in shapes.values()), settings, where=files.listing.where)
    return f"model: {adapter.family} config, {len(shapes)} tensors in safetensors"


def _on_this_server(ref: Reference, context: SourceContext) -> tuple[Path | None, dict[str, Any] | None] | None:
    """What ``ref`` is here: a directory ``(path, None)``, or an upload's or archive's indexed contents
    ``(None, contents)`` (None when not indexed); None for a scheme the worker fetches."""
    if ref.scheme == "upload":
        upload = context.find_upload(ref.target)
        return None, (upload.contents if upload is not None else None)
    if ref.scheme == "file":
        path = resolve_local(ref.target, context.settings)
        return (path, None) if path.is_dir() else (None, _archive_contents(path, context))
    return None


def _model_files(ref: Reference, context: SourceContext, skipped: list[str]) -> _Model | None:
    here = _on_this_server(ref, context)
    if here is None:
        skipped.append(f"model {ref.uri}: checked by the worker ({ref.scheme}:// inputs are fetched there)")
        return None
    directory, contents = here
    return _from_directory(directory) if directory is not None else _from_contents(contents, ref, skipped)


def _from_contents(contents: dict[str, Any] | None, ref: Reference, skipped: list[str]) -> _Model | None:
    if not contents or contents.get("version") != CONTENTS_VERSION or "files" not in contents:
        skipped.append(f"model {ref.uri}: checked by the worker (not indexed at upload)")
        return None
    where = "<model>" + (f"/{contents['root']}" if contents["root"] else "")
    texts: dict[str, str] = dict(contents["texts"])
    listing = ModelFiles(where=where, names=frozenset(contents["files"]), read=lambda name: _text(texts, name))
    return _Model(listing=listing, texts=texts, headers=dict(contents["headers"]))


def _text(texts: dict[str, str], name: str) -> bytes:
    if name not in texts:
        raise OSError(f"{name} was too large to read at upload")
    return texts[name].encode("utf-8")


def _from_directory(path: Path) -> _Model:
    listing = ModelFiles.of_directory(path)
    texts: dict[str, str] = {}
    for name in SMALL_FILES:
        if name in listing.names and (path / name).stat().st_size <= MAX_SMALL_FILE:
            texts[name] = (path / name).read_text(encoding="utf-8", errors="replace")
    headers: dict[str, dict[str, Any]] = {}
    for name in sorted(n for n in listing.names if n.endswith(".safetensors")):
        try:
            with open(path / name, "rb") as handle:
                shapes = safetensors_header(handle, (path / name).stat().st_size, name=name)
            headers[name] = {"shapes": {k: list(v) for k, v in shapes.items()}}
        except ModelLoadError as exc:
            headers[name] = {"error": str(exc)}
    return _Model(listing=listing, texts=texts, headers=headers)


def _archive_contents(path: Path, context: SourceContext) -> dict[str, Any] | None:
    settings = context.settings
    # The unpacker's own checks first (links, `..`, limits), with its words: what the worker would say.
    check_archive(path, max_bytes=settings.max_unpacked_bytes, max_members=settings.max_archive_members)
    try:
        return index_archive(path, max_rows=settings.max_dataset_rows)
    except Exception:  # unreadable here: the worker's unpacker says what is wrong with it
        return None


def _dataset(ref: Reference, eval_ref: Reference | None, options: DatasetOptions, context: SourceContext,
             skipped: list[str]) -> tuple[DatasetProfile | None, str]:
    if eval_ref is not None:
        return _split_pair(ref, eval_ref, options, context, skipped), "<dataset>"
    here = _on_this_server(ref, context)
    if here is None:
        skipped.append(f"dataset {ref.uri}: checked by the worker ({ref.scheme}:// inputs are fetched there)")
        return None, ""
    directory, contents = here
    if directory is not None:
        return profile_directory(directory, max_rows=context.settings.max_dataset_rows), str(directory)
    return _archive_dataset(contents, ref, skipped)


def _archive_dataset(contents: dict[str, Any] | None, ref: Reference, skipped: list[str]
                     ) -> tuple[DatasetProfile | None, str]:
    if not contents or contents.get("version") != CONTENTS_VERSION or not contents.get("dataset"):
        skipped.append(f"dataset {ref.uri}: checked by the worker (not indexed at upload)")
        return None, ""
    where = "<dataset>" + (f"/{contents['root']}" if contents["root"] else "")
    return DatasetProfile.from_dict(contents["dataset"]), where


def _split_pair(ref: Reference, eval_ref: Reference, options: DatasetOptions, context: SourceContext,
                skipped: list[str]) -> DatasetProfile | None:
    """The two single split files of ``uri`` + ``eval_uri``, as the worker places them (``<split>.<suffix>``)."""
    eval_split = options.eval_split or "test"
    profiles: dict[str, SplitProfile] = {}
    errors: dict[str, str] = {}
    for reference, split in ((ref, options.train_split), (eval_ref, eval_split)):
        single = _single_profile(reference, split, context)
        if single is None:
            skipped.append(f"dataset {reference.uri}: checked by the worker (not indexed at upload)")
            return None
        if single.error is not None:
            errors[split] = single.error
        elif single.errors:
            errors[split] = next(iter(single.errors.values()))
        else:
            profiles[split] = next(iter(single.profiles.values()))
    return DatasetProfile(format="files", splits=(options.train_split, eval_split), profiles=profiles, errors=errors)


def _single_profile(ref: Reference, split: str, context: SourceContext) -> DatasetProfile | None:
    if ref.scheme == "upload":
        upload = context.find_upload(ref.target)
        contents = upload.contents if upload is not None else None
        if not contents or contents.get("version") != CONTENTS_VERSION or "split" not in contents:
            return None
        return DatasetProfile.from_dict(relabel(contents["split"], {SPLIT_PLACEHOLDER: split}))
    if ref.scheme == "file":
        path = resolve_local(ref.target, context.settings)
        record = index_upload(path, kind="data", suffix=path.suffix.lower(), max_rows=context.settings.max_dataset_rows)
        if record is None:
            return None
        return DatasetProfile.from_dict(relabel(record["split"], {SPLIT_PLACEHOLDER: split}))
    return None
