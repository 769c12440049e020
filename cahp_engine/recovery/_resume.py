"""A fine-tuning's state on disk, to go on from it later, in another process on another machine.

:meth:`~cahp_engine.recovery.FineTuning.state_dict` (the weights, AdamW's moments, the schedule, the
fp16 loss scale, the random generators, the losses so far, the best evaluation's weights) is written
by :func:`save_training_state` and read back by :func:`load_training_state`;
``finetune(..., hooks=FineTuningHooks(resume=state))`` then goes on from it and ends as a fine-tuning
never stopped would (the batch order of every epoch comes from ``(seed, epoch)`` alone, dropout from the
saved generator).

No pickle: tensors go into one safetensors file, everything else into JSON (a tagged tree that keeps
integer keys and tuples), and only these two are read back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from cahp_engine.errors import PipelineError

TENSORS_FILE = "training.safetensors"
STATE_FILE = "training.json"
#: Every file :func:`save_training_state` writes.
TRAINING_FILES = (TENSORS_FILE, STATE_FILE)
#: Changes when what :meth:`TrainingState.save` writes changes; a state of another version is not read.
STATE_VERSION = 1


def save_training_state(state: Mapping[str, Any], directory: Path) -> None:
    """Write :meth:`~cahp_engine.recovery.FineTuning.state_dict` into ``directory`` (created).

    Parameters
    ----------
    state : mapping
        Tensors (any shape; the weights, AdamW's moments, the random generators' states), dicts,
        lists, tuples and JSON scalars, nested.
    directory : path
        Receives :data:`TENSORS_FILE` and :data:`STATE_FILE`.
    """
    directory.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    tree = {"version": STATE_VERSION, "state": _encode(dict(state), "s", tensors)}
    seen: set[int] = set()
    for name, tensor in tensors.items():
        if tensor.numel() and tensor.data_ptr() in seen:
            tensors[name] = tensor.clone()  # safetensors keeps no two names over one storage
        seen.add(tensors[name].data_ptr())
    save_file(tensors, str(directory / TENSORS_FILE))
    (directory / STATE_FILE).write_text(json.dumps(tree), encoding="utf-8")


def load_training_state(directory: Path) -> dict[str, Any]:
    """Read what :func:`save_training_state` wrote; tensors come back on the CPU.

    Raises
    ------
    PipelineError
        When the files are missing, unreadable, or of another :data:`STATE_VERSION`.
    """
    try:
        tree = json.loads((directory / STATE_FILE).read_text(encoding="utf-8"))
        if tree.get("version") != STATE_VERSION:
            raise ValueError(f"version {tree.get('version')!r}, expected {STATE_VERSION}")
        state = _decode(tree["state"], load_file(str(directory / TENSORS_FILE)))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PipelineError(f"the saved training state in {directory} cannot be read ({type(exc).__name__}: "
                            f"{exc})") from exc
    if not isinstance(state, dict):
        raise PipelineError(f"the saved training state in {directory} does not hold a state")
    return state


def _encode(value: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    """``value`` as JSON: tensors moved into ``tensors`` (under their path), dict keys and tuples tagged."""
    if isinstance(value, torch.Tensor):
        tensors[path] = value.detach().to("cpu").contiguous()
        return {"t": path}
    if isinstance(value, dict):
        return {"d": [[_key(k), _encode(v, f"{path}.{k}", tensors)] for k, v in value.items()]}
    if isinstance(value, tuple):
        return {"u": [_encode(v, f"{path}.{i}", tensors) for i, v in enumerate(value)]}
    if isinstance(value, list):
        return {"l": [_encode(v, f"{path}.{i}", tensors) for i, v in enumerate(value)]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"v": value}
    raise TypeError(f"cannot save a {type(value).__name__} at {path} in a training state")


def _key(key: Any) -> Any:
    if isinstance(key, bool) or not isinstance(key, (int, str)):
        raise TypeError(f"cannot save the dictionary key {key!r} in a training state")
    return key


def _decode(node: Any, tensors: dict[str, torch.Tensor]) -> Any:
    (tag, value), = node.items()
    if tag == "t":
        return tensors[value]
    if tag == "d":
        return {key: _decode(item, tensors) for key, item in value}
    if tag == "u":
        return tuple(_decode(item, tensors) for item in value)
    if tag == "l":
        return [_decode(item, tensors) for item in value]
    if tag == "v":
        return value
    raise ValueError(f"unknown node {tag!r}")
