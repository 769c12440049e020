"""Checking a model before any tensor of it is allocated: its declared size and its weights' shapes.

A ``config.json`` of a few hundred bytes says how large a model is, and transformers allocates what
it says, initialising at random whatever the weights lack, before it finds that the weights do not
fit. A 100 KB checkpoint could so make a process allocate tens of gigabytes (hidden size 65536 and
1000 layers asked for one 17 GB tensor). Every load therefore passes these checks first, in an order
in which nothing sized by the config exists yet:

1. the raw ``config.json``, before transformers parses it
   (:func:`~cahp_engine.models._model_files.check_declarations`): the layers
   it declares, which size Python lists and module lists, must be no more than the weight files
   hold (nor :data:`~cahp_engine.models._limits.MAX_LAYERS`), and ``num_labels``, which
   transformers expands into an ``id2label`` table, has a ceiling;
2. the parsed config (:func:`check_heads`): no more heads per layer than the hidden size;
3. the architecture, built on the ``meta`` device (:func:`build_on_meta`: shapes, no storage), is
   counted against the caller's parameter limit, and the buffers no checkpoint holds
   (``position_ids``) against :data:`~cahp_engine.models._limits.MAX_UNSAVED_BUFFER_ELEMENTS`;
4. every tensor the architecture needs is compared, by name and shape, with the safetensors
   headers, read without loading a tensor (:func:`weight_shapes`, :func:`check_fit`).

A model that passes allocates only what its weight files hold, plus a new classification head
(hidden size x labels) and a pooler when the checkpoint lacks them.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import torch
import transformers
from safetensors import safe_open
from torch import nn

from cahp_engine._torch import num_parameters
from cahp_engine.errors import InvalidInputError, ModelLoadError
from cahp_engine.models._families import ModelAdapter
from cahp_engine.models._limits import MAX_UNSAVED_BUFFER_ELEMENTS
from cahp_engine.models._model_files import is_count, safetensors_header

#: How many offending tensors a refusal names.
SHOWN = 3

_LIMIT_NAMES = "the service's CAHP_MAX_MODEL_PARAMS; --max-model-params of cahp prune and cahp export"
# Old checkpoints persisted these buffers; transformers ignores them (see
# PreTrainedModel._adjust_missing_and_unexpected_keys), so they are no sign of a misfit here either.
_IGNORED_UNEXPECTED = (r"(^|\.)position_ids$", r"rotary_emb\.inv_freq")


def check_limit(max_params: Any) -> None:
    """Refuse a parameter limit that is not a positive integer (it comes from a flag or a setting)."""
    if not is_count(max_params) or max_params < 1:
        raise InvalidInputError(f"the parameter limit (`max_params`) must be an integer >= 1, got {max_params!r}")


def weight_shapes(files: Iterable[Path]) -> dict[str, tuple[int, ...]]:
    """The name and shape of every tensor in the safetensors ``files``, read from their headers only.

    Raises
    ------
    ModelLoadError
        If a file is not a readable safetensors file (the library checks that its header and size agree).
    """
    shapes: dict[str, tuple[int, ...]] = {}
    for path in files:
        # The header's own checks first (what the job service also runs at submit, in the same words).
        with open(path, "rb") as raw:
            safetensors_header(raw, path.stat().st_size, name=path.name)
        try:
            with safe_open(str(path), framework="pt") as handle:
                for name in handle.keys():
                    shapes[name] = tuple(int(n) for n in handle.get_slice(name).get_shape())
        except Exception as exc:  # SafetensorError, OSError, ValueError on a malformed header
            raise ModelLoadError(
                f"{path.name!r} is not a readable safetensors file: {type(exc).__name__}: {exc}"
            ) from exc
    return shapes


def check_heads(config: Any, adapter: ModelAdapter, *, ref: str) -> None:
    """Refuse a config with more attention heads per layer than hidden units (head bookkeeping is per head)."""
    heads, hidden = adapter.num_heads(config), int(getattr(config, adapter.config_hidden_attr))
    if not 1 <= heads <= hidden:
        raise ModelLoadError(
            f"{ref!r}: config.json declares {heads} attention heads per layer for a hidden size of {hidden}; "
            "a layer has at least one head and no more heads than hidden units"
        )


def build_on_meta(config: Any, *, max_params: int, ref: str) -> nn.Module:
    """The ``*ForSequenceClassification`` architecture of ``config`` on the ``meta`` device (shapes, no storage),
    refused by :func:`_check_size` when it is larger than ``max_params``."""
    with torch.device("meta"):
        model = transformers.AutoModelForSequenceClassification.from_config(
            copy.deepcopy(config), trust_remote_code=False
        )
    _check_size(model, max_params=max_params, ref=ref)
    return model


def _check_size(model: nn.Module, *, max_params: int, ref: str) -> None:
    """Count ``model``'s parameters (on any device, ``meta`` included) and refuse it above ``max_params``.

    Tied parameters count once. Buffers that the weights do not hold (not in the state dict) are built
    from the config when the model is materialised, so they are held to :data:`MAX_UNSAVED_BUFFER_ELEMENTS`.
    """
    params = num_parameters(model)
    if params > max_params:
        raise ModelLoadError(
            f"{ref!r} declares {params:,} parameters, more than the limit of {max_params:,} ({_LIMIT_NAMES}); "
            "a model is refused before any of it is allocated"
        )
    saved = set(model.state_dict())
    unsaved = [(name, buffer) for name, buffer in model.named_buffers() if name not in saved]
    elements = sum(buffer.numel() for _, buffer in unsaved)
    if elements > MAX_UNSAVED_BUFFER_ELEMENTS:
        largest = max(unsaved, key=lambda item: item[1].numel())
        raise ModelLoadError(
            f"{ref!r}: its config asks for {elements:,} buffer elements that no weight file holds (largest "
            f"{largest[0]} {tuple(largest[1].shape)}), more than {MAX_UNSAVED_BUFFER_ELEMENTS:,}; check "
            "`max_position_embeddings`"
        )


def check_fit(
    model: nn.Module, shapes: Mapping[str, tuple[int, ...]], *, ref: str, strict: bool = False,
    new_head: bool = False,
) -> None:
    """Refuse weights that do not fit ``model`` (built on ``meta``), by name and shape.

    Parameters
    ----------
    model : the architecture the config describes, usually from :func:`build_on_meta`
    shapes : tensor name -> shape of the weight files (see :func:`weight_shapes`)
    ref : how messages name the model
    strict : bool
        Every tensor by its exact name, none missing, none left over, as
        ``safetensors.torch.load_model(strict=True)`` reads a pruned checkpoint. Otherwise names are
        mapped as ``from_pretrained`` maps them (legacy ``gamma``/``beta`` names, a bare encoder's
        names without the model prefix), and these are accepted:

        - a classification head (anything outside the base model) and a BERT pooler that the weights
          lack: they are created new, as for a base model to fine-tune;
        - tensors outside the parts the base model has (pre-training heads such as ``cls.*`` or
          ``lm_head.*``, a pooler the classifier does not use, persisted ``position_ids``);
        - a head of another shape when ``new_head`` (``num_labels`` differs from the checkpoint's).
    new_head : bool
        The caller re-creates the head for another number of labels.

    Raises
    ------
    ModelLoadError
        Naming the first :data:`SHOWN` missing, mis-shaped and unexpected tensors with their shapes.
    """
    expected = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    found: dict[str, tuple[int, ...] | None] = {}  # model name -> the weights' shape (None: converted, not compared)
    unexpected: list[tuple[str, tuple[int, ...]]] = []
    rename: Callable[[str], tuple[str, bool]] = (lambda key: (key, False)) if strict else _renamer(model, expected)
    for key, shape in shapes.items():
        target, converted = rename(key)
        if target in expected:
            found[target] = None if converted else shape
        elif strict or _inside_base(model, target) and not _ignored(model, target, unexpected=True):
            unexpected.append((key, shape))
    tied = _tied_names(model)
    missing = [
        (name, shape) for name, shape in expected.items()
        if name not in found and not any(other in found for other in tied.get(name, ()))
        and (strict or not _may_be_new(model, name))
    ]
    mismatched = [
        (name, got, expected[name]) for name, got in found.items()
        if got is not None and got != expected[name]
        and (strict or not new_head or _inside_base(model, name))
    ]
    if not (missing or mismatched or unexpected):
        return
    parts = []
    # The largest first: they say most about what the config declares.
    if missing:
        parts.append(f"{len(missing)} tensor(s) the config needs are missing ({_listed(missing)})")
    if mismatched:
        mismatched.sort(key=lambda item: (-_numel(item[2]), item[0]))
        shown = "; ".join(f"{n}: weights {tuple(w)}, config {tuple(c)}" for n, w, c in mismatched[:SHOWN])
        more = ", ..." if len(mismatched) > SHOWN else ""
        parts.append(f"{len(mismatched)} have another shape ({shown}{more})")
    if unexpected:
        parts.append(f"{len(unexpected)} are not in the architecture ({_listed(unexpected)})")
    raise ModelLoadError(
        f"the weights of {ref!r} do not match the architecture its config.json describes: " + "; ".join(parts)
    )


def _listed(items: Sequence[tuple[str, tuple[int, ...]]]) -> str:
    ordered = sorted(items, key=lambda item: (-_numel(item[1]), item[0]))
    shown = ", ".join(f"{name} {tuple(shape)}" for name, shape in ordered[:SHOWN])
    return shown + (", ..." if len(items) > SHOWN else "")


def _numel(shape: Sequence[int]) -> int:
    return math.prod(shape)


def _base(model: nn.Module) -> tuple[str, nn.Module | None]:
    prefix = str(getattr(model, "base_model_prefix", ""))
    base = getattr(model, prefix, None) if prefix else None
    return prefix, base if isinstance(base, nn.Module) else None


def _inside_base(model: nn.Module, name: str) -> bool:
    """Whether ``name`` lies in a part the base model has (its embeddings, its encoder, ...).

    A name without the model prefix (a bare encoder's) is read relative to the base model unless it
    starts with another part of the classifier (its head).
    """
    prefix, base = _base(model)
    if base is None:
        return False
    if name.startswith(prefix + "."):
        relative = name[len(prefix) + 1 :]
    elif name.split(".", 1)[0] in dict(model.named_children()):
        return False
    else:
        relative = name
    first = relative.split(".", 1)[0]
    return first in dict(base.named_children()) or first in base._parameters or first in base._buffers


def _may_be_new(model: nn.Module, name: str) -> bool:
    """A tensor ``from_pretrained`` may create when the weights lack it: the head, a pooler, ignored keys."""
    prefix, _ = _base(model)
    return (not _inside_base(model, name) or name.startswith(f"{prefix}.pooler.")
            or _ignored(model, name, unexpected=False))


def _ignored(model: nn.Module, name: str, *, unexpected: bool) -> bool:
    patterns = list(getattr(model, "_keys_to_ignore_on_load_unexpected" if unexpected
                            else "_keys_to_ignore_on_load_missing", None) or ())
    if unexpected:
        patterns += _IGNORED_UNEXPECTED
    return any(re.search(pattern, name) for pattern in patterns)


def _tied_names(model: nn.Module) -> dict[str, tuple[str, ...]]:
    """Parameter name -> the other names of the same tensor (safetensors stores a shared tensor once)."""
    groups: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    return {name: tuple(n for n in names if n != name) for names in groups.values() if len(names) > 1 for name in names}


def _renamer(model: nn.Module, expected: dict[str, tuple[int, ...]]) -> Callable[[str], tuple[str, bool]]:
    """A checkpoint name -> (model name, converted) mapping that follows ``from_pretrained``'s own.

    ``converted`` is True when a transformers converter (which may change shapes, e.g. by fusing
    tensors) produced the name; such tensors are matched by name only.
    """
    prefix, _ = _base(model)
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key
    except ImportError:  # a transformers 5 without these helpers: only the model prefix is mapped
        def with_prefix(key: str) -> tuple[str, bool]:
            prefixed = f"{prefix}.{key}"
            return (prefixed if key not in expected and prefixed in expected else key), False

        return with_prefix
    mapping = get_model_conversion_mapping(cast(Any, model))
    renamings = [entry for entry in mapping if isinstance(entry, WeightRenaming)]
    converters = [entry for entry in mapping if isinstance(entry, WeightConverter)]

    def rename(key: str) -> tuple[str, bool]:
        target, pattern = rename_source_key(key, renamings, converters, prefix, expected)
        if target not in expected and key in expected:
            target, pattern = rename_source_key(key, [], [], prefix, expected)
        return target, pattern is not None

    return rename
