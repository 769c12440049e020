"""What a model directory's files say before torch sees them: its config, its weight files, their headers.

The checks every load makes first (``config.json`` is a JSON object, weights are safetensors named
by a clean index, no pickle), written over a :class:`ModelFiles` listing rather than a directory, so
that the job service can run them at submit on what it recorded of an uploaded archive (its file
names, its small JSON files, its safetensors headers) with the words the worker would use. The
directory functions (:func:`check_weight_files`, :func:`local_weight_files`) are the same checks over a
directory. :func:`safetensors_header` reads a safetensors header with the standard library.

Light: no torch, no numpy.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from cahp_engine._validation import excerpt, is_plain_file_name
from cahp_engine.errors import ModelLoadError
from cahp_engine.models._families import ModelAdapter
from cahp_engine.models._limits import MAX_LAYERS, MAX_NUM_LABELS, MAX_SAFETENSORS_HEADER_BYTES, MAX_TENSOR_RANK

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX = f"{WEIGHTS_FILE}.index.json"
# Weight files we refuse to read (pickle) but recognise, to say what to do instead.
PICKLED_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")
_LAYER_KEYS = ("num_hidden_layers", "n_layers")
_DTYPES = ("float32", "float16", "bfloat16")
#: The longest safetensors header read (the format's own cap is 100 MB); a longer one is refused unread.
MAX_HEADER_BYTES = MAX_SAFETENSORS_HEADER_BYTES
#: Bytes per element of each safetensors dtype: a tensor's bytes must be its elements times this.
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8,
               "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def read_config(config_file: Path) -> dict[str, Any]:
    """The JSON object of ``config_file`` as written, before transformers parses (and acts on) it.

    Raises
    ------
    ModelLoadError
        If the file cannot be read or does not hold a JSON object.
    """
    return _config_object(lambda: config_file.read_text(encoding="utf-8"), str(config_file))


def local_weight_files(directory: Path) -> list[Path]:
    """The safetensors files ``from_pretrained`` reads in ``directory``: the index's shards, or the one file.

    Call :func:`check_weight_files` first; this only lists.

    Raises
    ------
    ModelLoadError
        If the directory has neither an index nor ``model.safetensors``.
    """
    index = directory / WEIGHTS_INDEX
    if index.is_file():
        return [directory / shard for shard in check_weight_index_names(index)]
    if (directory / WEIGHTS_FILE).is_file():
        return [directory / WEIGHTS_FILE]
    refuse_pickled_weights(directory)
    raise ModelLoadError(
        f"{str(directory)!r} has no {WEIGHTS_FILE} (nor a {WEIGHTS_INDEX}); cahp reads safetensors weights only"
    )


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
    return _index_names(lambda: index.read_text(encoding="utf-8"))


def refuse_pickled_weights(directory: Path) -> None:
    """Raise when ``directory`` has no safetensors file but pickled PyTorch weights.

    Unpickling runs arbitrary code, so such a checkpoint is refused with the way out.
    """
    if any(directory.glob("*.safetensors")):
        return
    if any((directory / name).is_file() for name in PICKLED_WEIGHTS):
        raise _pickled(str(directory))


@dataclass(frozen=True)
class ModelFiles:
    """The top level of a model directory: its regular files' names, and the content of the small ones.

    ``where`` is how messages name the directory (``str(directory)`` for a real one); ``read(name)``
    returns a file's bytes (raising ``OSError`` when it cannot).
    """

    where: str
    names: frozenset[str]
    read: Callable[[str], bytes]

    @classmethod
    def of_directory(cls, directory: Path) -> ModelFiles:
        names = frozenset(p.name for p in directory.iterdir() if p.is_file()) if directory.is_dir() else frozenset()
        return cls(where=str(directory), names=names, read=lambda name: (directory / name).read_bytes())

    def config(self) -> dict[str, Any]:
        """``config.json`` as :func:`read_config` reads it (ModelLoadError when missing or not an object)."""
        if CONFIG_FILE not in self.names:
            raise ModelLoadError(f"{self.where!r} has no {CONFIG_FILE}; pass a directory written by save_pretrained "
                                 "or save_pruned")
        return _config_object(lambda: self.read(CONFIG_FILE).decode("utf-8"), f"{self.where}/{CONFIG_FILE}")

    def check(self) -> None:
        """:func:`check_weight_files` on this listing: no pickle-only weights, an index naming present files."""
        if not any(name.endswith(".safetensors") for name in self.names) and any(
                name in self.names for name in PICKLED_WEIGHTS):
            raise _pickled(self.where)
        if WEIGHTS_INDEX in self.names:
            for shard in _index_names(lambda: self.read(WEIGHTS_INDEX).decode("utf-8")):
                if shard not in self.names:
                    raise ModelLoadError(f"the model's {WEIGHTS_INDEX} names {shard!r}, which is not a file in the "
                                         "model")

    def weights(self) -> list[str]:
        """:func:`local_weight_files` on this listing: the safetensors files a load reads (ModelLoadError if none)."""
        if WEIGHTS_INDEX in self.names:
            return _index_names(lambda: self.read(WEIGHTS_INDEX).decode("utf-8"))
        if WEIGHTS_FILE in self.names:
            return [WEIGHTS_FILE]
        self.check()
        raise ModelLoadError(
            f"{self.where!r} has no {WEIGHTS_FILE} (nor a {WEIGHTS_INDEX}); cahp reads safetensors weights only"
        )


def safetensors_header(handle: IO[bytes], size: int, *, name: str) -> dict[str, tuple[int, ...]]:
    """The name and shape of every tensor in a safetensors file, from its header alone (``size``: the file's bytes).

    Raises
    ------
    ModelLoadError
        When the header cannot be a safetensors header, or its tensors lie past the end of the file.
    """
    def refuse(why: str) -> ModelLoadError:
        return ModelLoadError(f"{name!r} is not a readable safetensors file: {why}")

    prefix = handle.read(8)
    if len(prefix) < 8:
        raise refuse("it is shorter than the 8-byte header length")
    (length,) = struct.unpack("<Q", prefix)
    if 8 + length > size:
        raise refuse(f"its header claims {length} bytes, more than the file holds")
    if length > MAX_HEADER_BYTES:
        raise refuse(f"its header claims {length:,} bytes, more than cahp's limit of {MAX_HEADER_BYTES:,} bytes "
                     "(MAX_SAFETENSORS_HEADER_BYTES; the format allows 100 MB, a real header needs about 150 "
                     "bytes per tensor); it is refused unread")
    try:
        header = json.loads(handle.read(length).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise refuse(f"its header is not JSON ({type(exc).__name__})") from exc
    if not isinstance(header, dict):
        raise refuse("its header is not a JSON object")
    shapes: dict[str, tuple[int, ...]] = {}
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        shapes[key] = _tensor_shape(entry, key, 8 + length, size, refuse)
    return shapes


def _tensor_shape(entry: Any, key: str, start: int, size: int, refuse: Callable[[str], ModelLoadError]
                  ) -> tuple[int, ...]:
    """One header entry's shape, checked: rank, dimensions, dtype, and bytes that fit its offsets and the file."""
    shape = entry.get("shape") if isinstance(entry, Mapping) else None
    offsets = entry.get("data_offsets") if isinstance(entry, Mapping) else None
    if not isinstance(shape, list) or len(shape) > MAX_TENSOR_RANK:
        # The rank first, before a long list of dimensions is looked at element by element.
        rank = f"{len(shape):,} dimensions, more than {MAX_TENSOR_RANK}" if isinstance(shape, list) else "no shape"
        raise refuse(f"the entry of {excerpt(key)} has {rank}")
    if (not all(type(n) is int and 0 <= n < 2**48 for n in shape)
            or not isinstance(offsets, list) or len(offsets) != 2
            or not all(type(n) is int and 0 <= n for n in offsets) or offsets[0] > offsets[1]):
        raise refuse(f"the entry of {excerpt(key)} has no valid shape and data offsets")
    if start + offsets[1] > size:
        raise refuse(f"tensor {excerpt(key)} lies past the end of the file (truncated?)")
    itemsize = DTYPE_BYTES.get(entry.get("dtype")) if isinstance(entry.get("dtype"), str) else None
    if itemsize is None:
        raise refuse(f"tensor {excerpt(key)} has the unknown dtype {excerpt(entry.get('dtype'))}")
    elements = 1
    for n in shape:
        elements *= n
    if elements * itemsize != offsets[1] - offsets[0]:
        raise refuse(f"tensor {excerpt(key)} declares {elements:,} elements of {itemsize} bytes in "
                     f"{offsets[1] - offsets[0]:,} bytes")
    return tuple(shape)


def _config_object(text: Callable[[], str], shown: str) -> dict[str, Any]:
    try:
        config = json.loads(text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ModelLoadError(f"cannot read {shown!r}: {str(exc)[:200]}") from exc
    if not isinstance(config, dict):
        raise ModelLoadError(f"{shown!r} must hold a JSON object")
    return config


def _index_names(text: Callable[[], str]) -> list[str]:
    try:
        content = json.loads(text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ModelLoadError(f"the model's {WEIGHTS_INDEX} cannot be read as JSON ({type(exc).__name__})") from exc
    weight_map = content.get("weight_map") if isinstance(content, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ModelLoadError(f"the model's {WEIGHTS_INDEX} has no `weight_map` object")
    shards = sorted({str(name) for name in weight_map.values()})
    for shard in shards:
        if not is_plain_file_name(shard) or not shard.endswith(".safetensors"):
            raise ModelLoadError(
                f"the model's {WEIGHTS_INDEX} names the weight file {shard!r}; cahp reads only .safetensors files "
                "that sit next to the index, named without a directory"
            )
    return shards


def _pickled(where: str) -> ModelLoadError:
    return ModelLoadError(
        f"{where!r} holds only pickled PyTorch weights (pytorch_model.bin); cahp loads "
        "safetensors only. Convert it where you trust the file: load the model with transformers "
        f"and call save_pretrained, which writes {WEIGHTS_FILE}"
    )


def check_declarations(raw: Mapping[str, Any], adapter: ModelAdapter, shapes: Mapping[str, Any], *, ref: str) -> None:
    """Refuse a raw ``config.json`` that declares more layers than its weights hold, too many labels, or float64.

    Parameters
    ----------
    raw : the ``config.json`` object as JSON gave it, before transformers parsed it
    adapter : the family's adapter
    shapes : the weights' tensor names (see :func:`weight_shapes`)
    ref : how messages name the model

    Notes
    -----
    This runs before transformers parses the config, because parsing already allocates by the
    config's numbers: ModernBERT's config builds a list of ``num_hidden_layers`` entries, every config
    an ``id2label`` table of ``num_labels`` entries, and :func:`build_on_meta` one module per layer.
    """
    held = weight_layers(shapes, adapter)
    for key in dict.fromkeys((*_LAYER_KEYS, adapter.config_layers_attr)):
        if key not in raw:
            continue
        value = raw[key]
        if not is_count(value):
            raise ModelLoadError(f"{ref!r}: `{key}` in config.json must be a non-negative integer, got {value!r}")
        if value > held:
            raise ModelLoadError(
                f"{ref!r}: config.json declares {value} layers (`{key}`) but its weights hold {held}; "
                "the config does not describe these weights"
            )
        if value > MAX_LAYERS:
            raise ModelLoadError(
                f"{ref!r}: config.json declares {value} layers (`{key}`); cahp loads at most {MAX_LAYERS}"
            )
    for key in ("dtype", "torch_dtype"):
        # The model is built in the config's dtype: float64 would hold a float16 file in four times its size.
        if raw.get(key) not in (None, *_DTYPES):
            raise ModelLoadError(
                f"{ref!r}: `{key}` in config.json must be one of {', '.join(_DTYPES)}, got {raw[key]!r}"
            )
    if "num_labels" in raw:
        labels = raw["num_labels"]
        if not is_count(labels) or not 1 <= labels <= MAX_NUM_LABELS:
            raise ModelLoadError(
                f"{ref!r}: `num_labels` in config.json must be an integer in [1, {MAX_NUM_LABELS:,}], got {labels!r}"
            )


def weight_layers(shapes: Iterable[str], adapter: ModelAdapter) -> int:
    """How many distinct encoder layers (``<layers_path>.<i>.``) the tensor names cover."""
    pattern = re.compile(r"(?:^|\.)" + re.escape(adapter.layers_path) + r"\.(\d{1,9})\.")
    return len({match.group(1) for name in shapes if (match := pattern.search(name))})


def is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
