"""Loading the classifier a user names: a local directory or a Hugging Face hub id.

Every load is safe by construction: ``trust_remote_code=False`` and safetensors weights only, so no
code or pickle from the checkpoint ever runs. Nothing is allocated by what ``config.json`` declares
until :mod:`cahp_engine.models._preflight` has checked it: the layer and label counts against the weight
files, the parameter count of the architecture built on the ``meta`` device against the caller's
limit, and every tensor's name and shape against the safetensors headers. A directory whose config
carries the ``cahp`` record is a pruned model and goes through :func:`cahp_engine.models.load_pruned`.
"""

from __future__ import annotations

import os
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import huggingface_hub
import torch
import transformers
from huggingface_hub import errors as hub_errors
from torch import nn

from cahp_engine.errors import CahpError, InvalidInputError, ModelLoadError
from cahp_engine.models._adapters import ModelAdapter, get_adapter
from cahp_engine.models._checkpoint import load_pruned, pruned_weights_file
from cahp_engine.models._limits import DEFAULT_MAX_MODEL_PARAMS
from cahp_engine.models._model_files import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    WEIGHTS_INDEX,
    check_declarations,
    check_weight_files,
    check_weight_index_names,
    local_weight_files,
    read_config,
)
from cahp_engine.models._preflight import (
    build_on_meta,
    check_fit,
    check_heads,
    check_limit,
    weight_shapes,
)
from cahp_engine.models._surgery import RECORD_ATTR


@dataclass(frozen=True)
class LoadedClassifier:
    """A sequence classifier ready for pruning, with what is known about where it came from.

    Attributes
    ----------
    model : the ``*ForSequenceClassification`` model, in eval mode
    tokenizer : its tokenizer
    family : the adapter family, e.g. ``"bert"``
    source : the reference the caller gave (directory or hub id)
    revision : the hub revision asked for, or None
    classifier_trained : bool
        False when some weights (in practice the classification head, or a pooler the checkpoint
        lacked) were newly initialised, including a head re-created for a different ``num_labels``.
        Pruning scores computed through an untrained head are meaningless.
    num_heads, num_layers : int
        Heads per layer and layers of the unpruned architecture, from the config.
    """

    model: nn.Module
    tokenizer: Any
    family: str
    source: str
    revision: str | None
    classifier_trained: bool
    num_heads: int
    num_layers: int


def load_classifier(
    ref: str,
    *,
    revision: str | None = None,
    num_labels: int | None = None,
    cache_dir: str | None = None,
    token: str | None = None,
    device: torch.device | str | None = None,
    seed: int = 0,
    max_params: int = DEFAULT_MAX_MODEL_PARAMS,
) -> LoadedClassifier:
    """Load a sequence classifier and its tokenizer from a directory or the Hugging Face hub.

    Parameters
    ----------
    ref : path of a local directory, or a hub id such as ``"org/name"``
    revision : hub branch, tag or commit; ignored for a local directory
    num_labels : number of classes; when it differs from the checkpoint's, the classification head
        is re-created (and ``classifier_trained`` is False)
    cache_dir, token : passed to the hub client
    device : where to put the model; CPU when None
    seed : seeds the initialisation of a re-created classification head (and of any weight the checkpoint
        lacks), so that a run fine-tuning a base model is reproducible from its seed; torch's global
        random state is left as it was
    max_params : int
        Most parameters the architecture may have (for a pruned model: before pruning). Counted on
        the ``meta`` device, before anything is allocated; the default fits XLM-RoBERTa-XL
        (see :data:`~cahp_engine.models.DEFAULT_MAX_MODEL_PARAMS`).

    Raises
    ------
    ModelLoadError
        If ``ref`` names no directory and no hub model, lacks a config, safetensors weights or a
        tokenizer, declares more than ``max_params`` parameters, or its weights do not fit the
        architecture its config describes (tensors missing, of another shape, or left over in the
        encoder; a missing or differently sized classification head is re-created instead).
    UnsupportedModelError
        If the config's model family has no adapter.
    InvalidInputError
        If ``num_labels`` is not an integer >= 2, or ``max_params`` not one >= 1.
    """
    if num_labels is not None and (isinstance(num_labels, bool) or not isinstance(num_labels, int) or num_labels < 2):
        raise InvalidInputError(f"`num_labels` must be an integer >= 2, got {num_labels!r}")
    check_limit(max_params)
    ref = os.fspath(ref)
    try:
        return _load_classifier(ref, revision=revision, num_labels=num_labels, cache_dir=cache_dir, token=token,
                                device=device, seed=seed, max_params=max_params)
    except (CahpError, MemoryError, torch.cuda.OutOfMemoryError):
        raise
    except Exception as exc:
        # A hostile or broken config.json or safetensors header fails deep inside transformers or
        # safetensors in many ways; each is the model's problem, reported as such.
        raise ModelLoadError(f"cannot load {ref!r} as a sequence classifier: {type(exc).__name__}: {exc}") from exc


def _load_classifier(
    ref: str,
    *,
    revision: str | None,
    num_labels: int | None,
    cache_dir: str | None,
    token: str | None,
    device: torch.device | str | None,
    seed: int,
    max_params: int,
) -> LoadedClassifier:
    hub = {"revision": revision, "cache_dir": cache_dir, "token": token}
    config_file = _config_file(ref, **hub)
    raw = read_config(config_file)
    adapter = get_adapter(types.SimpleNamespace(model_type=raw.get("model_type")))
    local = _local_directory(ref)
    where = str(local) if local is not None else ref
    pruned = RECORD_ATTR in raw
    if pruned:
        directory = local if local is not None else _download(ref, hub)
        files = [pruned_weights_file(directory)]
    elif local is not None:
        check_weight_files(local)
        files = local_weight_files(local)
    else:
        files = _hub_weight_files(ref, hub)
    shapes = weight_shapes(files)
    # Before anything parses config.json (the tokenizer's loader does too): transformers allocates by
    # the layer and label counts it declares.
    check_declarations(raw, adapter, shapes, ref=ref)
    tokenizer = _load_tokenizer(where, ref, hub)

    if pruned:
        model = load_pruned(directory, max_params=max_params)
        saved_config: Any = model.config
        saved_labels = int(saved_config.num_labels)
        if num_labels is not None and num_labels != saved_labels:
            raise ModelLoadError(
                f"{ref!r} is a pruned classifier with {saved_labels} labels; omit num_labels or pass {saved_labels}"
            )
        trained = True
    else:
        config = _checked_config(where, ref, adapter, shapes, num_labels, max_params, hub)
        # Weights missing from the checkpoint (a new head) are drawn from torch's global generator, whose
        # start-up seed is random: without a seed of its own, the same base model and run seed gave another
        # fine-tuned model each time.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model, trained = _from_pretrained(where, ref, adapter, config, num_labels is not None, hub)

    if device is not None:
        model.to(device)
    return LoadedClassifier(
        model=model.eval(),
        tokenizer=tokenizer,
        family=adapter.family,
        source=ref,
        revision=revision,
        classifier_trained=trained,
        num_heads=adapter.num_heads(model.config),
        num_layers=adapter.num_layers(model.config),
    )


def _local_directory(ref: str) -> Path | None:
    path = Path(ref).expanduser()
    return path if path.exists() else None


def _looks_like_path(ref: str) -> bool:
    # A hub id is "name" or "owner/name"; anything else with a separator is meant as a path.
    return (
        Path(ref).expanduser().is_absolute()
        or ref.startswith((".", "~"))
        or ref.count("/") > 1
        or (os.sep != "/" and os.sep in ref)
    )


def _config_file(ref: str, **hub: Any) -> Path:
    local = _local_directory(ref)
    if local is not None:
        if not local.is_dir():
            raise ModelLoadError(f"{ref!r} is a file; pass the directory that holds the model")
        if not (local / CONFIG_FILE).is_file():
            raise ModelLoadError(
                f"{ref!r} has no {CONFIG_FILE}; pass a directory written by save_pretrained or save_pruned"
            )
        return local / CONFIG_FILE
    if _looks_like_path(ref):
        raise ModelLoadError(f"local model directory {ref!r} does not exist")
    not_found = (
        f"{ref!r} was not found on the Hugging Face hub or in the local cache "
        f"(revision {hub['revision'] or 'main'}); check the model id and revision, or pass a local directory"
    )
    try:
        return Path(huggingface_hub.hf_hub_download(ref, CONFIG_FILE, **hub))
    except hub_errors.HFValidationError as exc:
        raise ModelLoadError(f"{ref!r} is neither an existing directory nor a valid hub model id") from exc
    except hub_errors.GatedRepoError as exc:
        raise ModelLoadError(f"{ref!r} is gated on the hub; accept its terms and pass a token") from exc
    except (hub_errors.RepositoryNotFoundError, hub_errors.RevisionNotFoundError) as exc:
        raise ModelLoadError(f"{not_found}; a private model also needs a token") from exc
    except hub_errors.LocalEntryNotFoundError as exc:
        raise ModelLoadError(not_found) from exc
    except hub_errors.EntryNotFoundError as exc:
        raise ModelLoadError(f"{ref!r} exists on the hub but has no {CONFIG_FILE}") from exc
    except OSError as exc:
        raise ModelLoadError(f"{not_found} ({exc})") from exc


def _hub_weight_files(ref: str, hub: dict[str, Any]) -> list[Path]:
    """Fetch a hub model's safetensors files (the index's shards, or the one file), checking the index's names first.

    ``from_pretrained`` finds them in the cache afterwards; their headers are read before it runs.
    """
    try:
        index: Path | None = Path(huggingface_hub.hf_hub_download(ref, WEIGHTS_INDEX, **hub))
    except (hub_errors.EntryNotFoundError, hub_errors.LocalEntryNotFoundError):
        index = None  # a single model.safetensors
    except (OSError, hub_errors.HFValidationError) as exc:
        raise ModelLoadError(f"cannot fetch {WEIGHTS_INDEX} of {ref!r} from the hub: {exc}") from exc
    names = check_weight_index_names(index) if index is not None else [WEIGHTS_FILE]
    files = []
    for name in names:
        try:
            files.append(Path(huggingface_hub.hf_hub_download(ref, name, **hub)))
        except (hub_errors.EntryNotFoundError, hub_errors.LocalEntryNotFoundError) as exc:
            raise ModelLoadError(
                f"{ref!r} has no {name} on the hub. cahp reads safetensors weights only; a checkpoint with only "
                "pytorch_model.bin must be converted (load it with transformers and call save_pretrained)"
            ) from exc
        except (OSError, hub_errors.HFValidationError) as exc:
            raise ModelLoadError(f"cannot fetch {name} of {ref!r} from the hub: {exc}") from exc
    return files


def _checked_config(
    where: str, ref: str, adapter: ModelAdapter, shapes: dict[str, tuple[int, ...]], num_labels: int | None,
    max_params: int, hub: dict[str, Any],
) -> Any:
    """The config ``from_pretrained`` will build, once what it declares has been checked against the weights.

    After :func:`~cahp_engine.models._preflight.check_declarations`, in the order of
    :mod:`cahp_engine.models._preflight`: the heads, the parameter count of the ``meta`` architecture, then
    every tensor's name and shape.
    """
    labels = {"num_labels": num_labels} if num_labels is not None else {}
    config = transformers.AutoConfig.from_pretrained(where, trust_remote_code=False, **labels, **hub)
    check_heads(config, adapter, ref=ref)
    meta = build_on_meta(config, max_params=max_params, ref=ref)
    check_fit(meta, shapes, ref=ref, new_head=num_labels is not None)
    return config


def _download(ref: str, hub: dict[str, Any]) -> Path:
    """A local snapshot of a hub repository (a pruned model must be rebuilt from files)."""
    try:
        return Path(huggingface_hub.snapshot_download(ref, allow_patterns=["*.json", "*.safetensors", "*.txt",
                                                                         "*.model"], **hub))
    except (OSError, hub_errors.HFValidationError) as exc:
        raise ModelLoadError(f"cannot fetch {ref!r} from the hub: {exc}") from exc


def _load_tokenizer(where: str, ref: str, hub: dict[str, Any]) -> Any:
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(where, trust_remote_code=False, **hub)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise ModelLoadError(f"cannot load a tokenizer from {ref!r}: {exc}{_sentencepiece_hint(where)}") from exc
    # transformers 5 builds a tokenizer with only the special tokens when the files are missing,
    # which would silently map every word to [UNK].
    if len(tokenizer) <= len(set(tokenizer.all_special_ids)):
        raise ModelLoadError(
            f"{ref!r} has no tokenizer files (tokenizer.json, tokenizer_config.json or a vocabulary); "
            "save the tokenizer next to the model with tokenizer.save_pretrained"
        )
    return tokenizer


def _sentencepiece_hint(where: str) -> str:
    # DeBERTa-v3's released checkpoints ship only spm.model; transformers converts it with the
    # sentencepiece package and, failing that, reports a tiktoken error that hides the cause.
    directory = Path(where)
    if not directory.is_dir() or (directory / "tokenizer.json").is_file() or not any(directory.glob("*.model")):
        return ""
    return (" (the tokenizer is a SentencePiece model without tokenizer.json: install the `sentencepiece` "
            "package, or save the tokenizer with a recent transformers, which writes tokenizer.json)")


def _from_pretrained(
    where: str, ref: str, adapter: ModelAdapter, config: Any, new_head: bool, hub: dict[str, Any]
) -> tuple[nn.Module, bool]:
    # A head of another size cannot be loaded; it is re-created and reported as mismatched.
    labels: dict[str, Any] = {"ignore_mismatched_sizes": True} if new_head else {}
    try:
        model, info = transformers.AutoModelForSequenceClassification.from_pretrained(
            where, config=config, trust_remote_code=False, use_safetensors=True, output_loading_info=True,
            **labels, **hub
        )
    except OSError as exc:
        raise ModelLoadError(
            f"cannot load weights for {ref!r}: {exc}. cahp reads safetensors weights only; a checkpoint with "
            "only pytorch_model.bin must be converted (load it with transformers and call save_pretrained)"
        ) from exc
    except (RuntimeError, ValueError) as exc:
        raise ModelLoadError(f"cannot load {ref!r} as a sequence classifier: {exc}") from exc
    missing = set(info.get("missing_keys", ()))
    mismatched = set(info.get("mismatched_keys", ()))
    encoder = f"{adapter.base_model_attr}.{adapter.layers_path}."
    if any(key.startswith(encoder) for key in missing):
        raise ModelLoadError(
            f"{ref!r} lacks encoder weights ({sorted(k for k in missing if k.startswith(encoder))[:3]}...); "
            f"it is not a {adapter.family} checkpoint"
        )
    return model, not missing and not mismatched
