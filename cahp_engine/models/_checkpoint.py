"""Saving and loading pruned classifiers as ordinary Hugging Face directories.

A pruned model cannot be rebuilt by ``from_pretrained`` alone: its attention and feed-forward
projections are narrower than ``config.json`` implies, and may differ from layer to layer. The
directory therefore carries the ``cahp`` record written by :func:`cahp_engine.models.prune_heads` and
:func:`cahp_engine.models.prune_neurons`; :func:`load_pruned` builds the full architecture from the
config on the ``meta`` device, repeats the recorded surgery there, checks the result against the
weights' headers (:mod:`cahp_engine.models._preflight`), and only then allocates it and loads the weights,
strictly. Weights are read from safetensors only: no pickle, no remote code.
"""

from __future__ import annotations

import copy
import types
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
import transformers
from torch import nn

from cahp_engine.errors import CahpError, ModelLoadError
from cahp_engine.models._adapters import get_adapter
from cahp_engine.models._limits import DEFAULT_MAX_MODEL_PARAMS
from cahp_engine.models._model_files import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    check_declarations,
    read_config,
    refuse_pickled_weights,
)
from cahp_engine.models._neurons import neuron_record, prune_neurons
from cahp_engine.models._preflight import (
    build_on_meta,
    check_fit,
    check_heads,
    check_limit,
    weight_shapes,
)
from cahp_engine.models._surgery import RECORD_ATTR, prune_heads, pruning_record


def save_pruned(model: nn.Module, tokenizer: Any, path: str | Path) -> None:
    """Write ``model`` and ``tokenizer`` to the directory ``path`` (created if needed).

    Parameters
    ----------
    model : a supported ``*ForSequenceClassification`` model, pruned or not
    tokenizer : the model's tokenizer (anything with ``save_pretrained``)
    path : directory; existing files of the same names are overwritten

    Notes
    -----
    Writes ``config.json`` (with the ``cahp`` record when the model was pruned),
    ``model.safetensors`` and the tokenizer files. Tensors that share storage are written once,
    as safetensors requires. An unpruned save is a plain checkpoint that ``from_pretrained`` reads.
    """
    get_adapter(model)
    target = Path(path)
    target.mkdir(parents=True, exist_ok=True)
    # A copy, so that saving does not edit the live model's config.
    config: Any = copy.deepcopy(model.config)
    config.architectures = [type(model).__name__]
    config.save_pretrained(target)
    safetensors.torch.save_model(model, str(target / WEIGHTS_FILE), metadata={"format": "pt"})
    tokenizer.save_pretrained(target)


def load_pruned(
    path: str | Path, *, device: torch.device | str | None = None, max_params: int = DEFAULT_MAX_MODEL_PARAMS
) -> nn.Module:
    """Rebuild a classifier written by :func:`save_pruned` (or any single-file safetensors save).

    Parameters
    ----------
    path : directory holding ``config.json`` and ``model.safetensors``
    device : where to put the model; CPU when None
    max_params : int
        Most parameters the architecture may have before pruning (the unpruned model the record
        was cut from); checked on the ``meta`` device, before anything is allocated.

    Returns
    -------
    The ``*ForSequenceClassification`` model in eval mode, pruned as recorded in its config.

    Raises
    ------
    ModelLoadError
        If the directory, its config or its safetensors weights are missing, the ``cahp`` record is
        malformed, the architecture is above ``max_params``, or the weights do not fit the recorded
        architecture (by name and shape, checked before the model is allocated).
    UnsupportedModelError
        If the config names a model family without an adapter.
    """
    check_limit(max_params)
    directory = Path(path)
    config_file = directory / CONFIG_FILE
    ref = str(directory)
    if not directory.is_dir():
        raise ModelLoadError(f"model directory {ref!r} does not exist")
    if not config_file.is_file():
        raise ModelLoadError(f"{ref!r} has no {CONFIG_FILE}; point at a directory written by save_pruned")
    raw = read_config(config_file)
    adapter = get_adapter(types.SimpleNamespace(model_type=raw.get("model_type")))
    weights = pruned_weights_file(directory)
    shapes = weight_shapes([weights])
    # Before transformers parses the config: parsing allocates by the layer and label counts.
    check_declarations(raw, adapter, shapes, ref=ref)
    try:
        config = transformers.AutoConfig.from_pretrained(directory, trust_remote_code=False)
    except Exception as exc:  # hostile values fail in many ways (OSError, ValueError, TypeError, ...)
        raise ModelLoadError(f"cannot read {str(config_file)!r}: {type(exc).__name__}: {exc}") from exc
    get_adapter(config)
    check_heads(config, adapter, ref=ref)
    kept = pruning_record(config)
    neurons = neuron_record(config)
    # The record describes surgery still to be done on a freshly built, full-size model.
    if hasattr(config, RECORD_ATTR):
        delattr(config, RECORD_ATTR)
    try:
        # Built and cut on the meta device: the full-size architecture is never allocated, and the
        # pruned one only once its shapes match the weight file's.
        model = build_on_meta(config, max_params=max_params, ref=ref)
        if kept is not None:
            prune_heads(model, kept)
        if neurons is not None:
            prune_neurons(model, neurons)
    except CahpError:
        raise
    except Exception as exc:
        raise ModelLoadError(
            f"the architecture in {str(config_file)!r} cannot be built: {type(exc).__name__}: {exc}"
        ) from exc
    check_fit(model, shapes, ref=ref, strict=True)
    model.to_empty(device="cpu")
    try:
        safetensors.torch.load_model(model, str(weights), strict=True)
    except (RuntimeError, OSError) as exc:
        raise ModelLoadError(
            f"the weights in {str(weights)!r} do not match the architecture described by {CONFIG_FILE}: {exc}"
        ) from exc
    except Exception as exc:  # a malformed safetensors header (SafetensorError, ValueError, ...)
        raise ModelLoadError(
            f"{str(weights)!r} is not a readable safetensors file: {type(exc).__name__}: {exc}"
        ) from exc
    _fill_unsaved_buffers(model)
    if device is not None:
        model.to(device)
    return model.eval()


def _fill_unsaved_buffers(model: nn.Module) -> None:
    """Compute the buffers no checkpoint holds (``position_ids``, rotary frequencies) after ``to_empty``.

    As ``from_pretrained`` does after loading: every loaded tensor is marked initialised, so the
    model's own initialisation writes only the rest, which are those buffers.
    """
    saved = model.state_dict(keep_vars=True)
    for tensor in saved.values():
        tensor._is_hf_initialized = True
    model.initialize_weights()  # type: ignore[operator]


def pruned_weights_file(directory: Path) -> Path:
    """The one ``model.safetensors`` :func:`load_pruned` reads; a ModelLoadError says what is there instead."""
    weights = directory / WEIGHTS_FILE
    if weights.is_file():
        return weights
    refuse_pickled_weights(directory)
    if (directory / f"{WEIGHTS_FILE}.index.json").is_file():
        raise ModelLoadError(
            f"{str(directory)!r} holds sharded safetensors; load_pruned reads a single {WEIGHTS_FILE}, "
            "as written by save_pruned"
        )
    raise ModelLoadError(f"{str(directory)!r} has no {WEIGHTS_FILE}")
