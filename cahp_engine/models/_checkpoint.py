"""Saving and loading pruned classifiers as ordinary Hugging Face directories.

A pruned model cannot be rebuilt by ``from_pretrained`` alone: its attention projections are
narrower than ``config.json`` implies. The directory therefore carries the ``cahp`` record written
by :func:`cahp_engine.models.prune_heads`; :func:`load_pruned` builds the full architecture from the
config, repeats the recorded surgery, and only then loads the weights, strictly. Weights are read
from safetensors only: no pickle, no remote code.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
import transformers
from torch import nn

from cahp_engine.errors import CahpError, ModelLoadError
from cahp_engine.models._adapters import get_adapter
from cahp_engine.models._surgery import RECORD_ATTR, prune_heads, pruning_record

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX = f"{WEIGHTS_FILE}.index.json"
# Weight files we refuse to read (pickle) but recognise, to say what to do instead.
PICKLED_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")


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


def load_pruned(path: str | Path, *, device: torch.device | str | None = None) -> nn.Module:
    """Rebuild a classifier written by :func:`save_pruned` (or any single-file safetensors save).

    Parameters
    ----------
    path : directory holding ``config.json`` and ``model.safetensors``
    device : where to put the model; CPU when None

    Returns
    -------
    The ``*ForSequenceClassification`` model in eval mode, pruned as recorded in its config.

    Raises
    ------
    ModelLoadError
        If the directory, its config or its safetensors weights are missing, the ``cahp`` record is
        malformed, or the weights do not fit the recorded architecture.
    UnsupportedModelError
        If the config names a model family without an adapter.
    """
    directory = Path(path)
    config_file = directory / CONFIG_FILE
    if not directory.is_dir():
        raise ModelLoadError(f"model directory {str(directory)!r} does not exist")
    if not config_file.is_file():
        raise ModelLoadError(f"{str(directory)!r} has no {CONFIG_FILE}; point at a directory written by save_pruned")
    try:
        config = transformers.AutoConfig.from_pretrained(directory, trust_remote_code=False)
    except Exception as exc:  # hostile values fail in many ways (OSError, ValueError, TypeError, ...)
        raise ModelLoadError(f"cannot read {str(config_file)!r}: {type(exc).__name__}: {exc}") from exc
    get_adapter(config)
    kept = pruning_record(config)
    weights = _weights_file(directory)
    # The record describes surgery still to be done on a freshly built, full-size model.
    if hasattr(config, RECORD_ATTR):
        delattr(config, RECORD_ATTR)
    try:
        model = transformers.AutoModelForSequenceClassification.from_config(config, trust_remote_code=False)
        if kept is not None:
            prune_heads(model, kept)
    except CahpError:
        raise
    except Exception as exc:
        raise ModelLoadError(
            f"the architecture in {str(config_file)!r} cannot be built: {type(exc).__name__}: {exc}"
        ) from exc
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
    if device is not None:
        model.to(device)
    return model.eval()


def check_weight_files(directory: Path) -> None:
    """Refuse a model directory whose weights could lead a loader outside it, or to a pickle.

    ``transformers`` follows the ``weight_map`` of ``model.safetensors.index.json`` to whatever file
    names it lists and opens any that is not ``.safetensors`` with ``torch.load``. So, before
    ``transformers`` sees the directory, every name in the index must be a plain file name (no
    directory part, no ``..``) ending in ``.safetensors`` and naming a regular file in ``directory``.

    Raises
    ------
    ModelLoadError
        For an unreadable index, or one naming anything else; also for pickle-only weights.
    """
    refuse_pickled_weights(directory)
    index = directory / WEIGHTS_INDEX
    if not (index.exists() or index.is_symlink()):
        return
    for shard in check_weight_index_names(index):
        if not (directory / shard).is_file():
            raise ModelLoadError(f"the model's {WEIGHTS_INDEX} names {shard!r}, which is not a file in the model")


def check_weight_index_names(index: Path) -> list[str]:
    """The shard names of a safetensors index, each a plain ``*.safetensors`` file name.

    Raises
    ------
    ModelLoadError
        When the index is unreadable, has no ``weight_map``, or names a path or another format.
    """
    try:
        content = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"the model's {WEIGHTS_INDEX} cannot be read as JSON ({type(exc).__name__})") from exc
    weight_map = content.get("weight_map") if isinstance(content, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ModelLoadError(f"the model's {WEIGHTS_INDEX} has no `weight_map` object")
    shards = sorted({str(name) for name in weight_map.values()})
    for shard in shards:
        plain = shard not in ("", ".", "..") and not any(c in shard for c in "/\\\x00")
        if not plain or not shard.endswith(".safetensors"):
            raise ModelLoadError(
                f"the model's {WEIGHTS_INDEX} names the weight file {shard!r}; cahp reads only .safetensors files "
                "that sit next to the index, named without a directory"
            )
    return shards


def refuse_pickled_weights(directory: Path) -> None:
    """Raise when ``directory`` has no safetensors file but pickled PyTorch weights.

    Unpickling runs arbitrary code, so such a checkpoint is refused with the way out.
    """
    if any(directory.glob("*.safetensors")):
        return
    if any((directory / name).is_file() for name in PICKLED_WEIGHTS):
        raise ModelLoadError(
            f"{str(directory)!r} holds only pickled PyTorch weights (pytorch_model.bin); cahp loads "
            "safetensors only. Convert it where you trust the file: load the model with transformers "
            f"and call save_pretrained, which writes {WEIGHTS_FILE}"
        )


def _weights_file(directory: Path) -> Path:
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
