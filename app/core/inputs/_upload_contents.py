"""What an upload holds, read once when it arrives, so that a job can be checked at submit without it.

An archive's top level (the root :func:`app.core.inputs._archives.unpack` would give the engine) is recorded:
its file and directory names, its small JSON files (``config.json``, the safetensors index, tokenizer
configs), the tensor names and shapes in the header of each safetensors file, and, for a dataset,
each split file's profile (:class:`cahp_engine.data.DatasetProfile`: columns, rows, label counts,
missing values; the engine reads the split files of a skeleton of the root for it). A single split
file gets its profile alone. :mod:`app.core.inputs._preflight` checks a job against this record.

Messages and names in the record are written as the worker's log shows them: ``<dataset>/...`` and
``<model>/...`` (the labels :mod:`worker.redaction` gives the unpacked inputs), so a refusal at submit
reads as the failure the job would have had.
"""

from __future__ import annotations

import errno
import io
import shutil
import tarfile
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any

from cahp_engine.data import CARD_FILES, FILE_SUFFIXES, SAVED_DICT, SAVED_STATE, profile_directory
from cahp_engine.errors import CahpError
from cahp_engine.models import MAX_HEADER_BYTES, safetensors_header

#: Changes when the record's layout does; an upload indexed by another version is not checked at submit.
CONTENTS_VERSION = 1
#: JSON files of a model's top level that submit reads (the config, the weights' index, code configs).
SMALL_FILES = ("config.json", "model.safetensors.index.json", "tokenizer_config.json", "processor_config.json")
#: The largest small file kept; a larger one is left to the worker.
MAX_SMALL_FILE = 1024 * 1024
#: Top-level names recorded (a model or dataset has a handful; an archive of many files is not profiled).
MAX_NAMES = 2000
#: Stands for the split name in the profile of a single split file (the worker names the file after the split).
SPLIT_PLACEHOLDER = "CAHP_SPLIT"


@dataclass(frozen=True)
class _Member:
    name: str  # relative to the archive's root
    is_dir: bool
    size: int
    order: int = 0  # position in the archive: reading in this order never seeks back in a compressed tar


def index_upload(local: Path, *, kind: str, suffix: str, max_rows: int | None) -> dict[str, Any] | None:
    """The contents record of the upload stored at ``local`` (already checked as safe); None if unreadable."""
    try:
        if kind == "data":
            return _index_split_file(local, suffix, max_rows)
        return index_archive(local, max_rows=max_rows)
    except (OSError, EOFError, zlib.error, tarfile.TarError, zipfile.BadZipFile, ValueError, CahpError) as exc:
        if _out_of_memory(exc):  # e.g. a scratch directory's cleanup failing after the memory ran out
            raise MemoryError(str(exc)[:200]) from exc
        return None


def _out_of_memory(exc: BaseException | None) -> bool:
    """Whether ``exc``, or an exception it arose from, is the process running out of memory."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, MemoryError) or (isinstance(exc, OSError) and exc.errno == errno.ENOMEM):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def index_archive(archive: Path, *, max_rows: int | None) -> dict[str, Any] | None:
    """The contents record of a tar or zip archive on disk (see the module docstring)."""
    with _archive(archive) as (members, read):
        tops = {m.name.split("/")[0] for m in members if m.name not in (".", "")}
        visible = sorted(t for t in tops if not t.startswith(".") and t != "__MACOSX")
        single = len(visible) == 1 and any(m.name.startswith(visible[0] + "/") or (m.name == visible[0] and m.is_dir)
                                          for m in members)
        root = visible[0] if single else ""
        prefix = f"{root}/" if root else ""
        top: dict[str, _Member] = {}
        for member in members:
            if not member.name.startswith(prefix) or member.name == root:
                continue
            relative = member.name[len(prefix):]
            first, _, rest = relative.partition("/")
            if first in ("", ".", ".."):
                continue  # never a name outside the root (the archive check refuses such archives anyway)
            if rest or member.is_dir:
                top.setdefault(first, _Member(first, True, 0, member.order))
            else:
                top[first] = member
        if len(top) > MAX_NAMES:
            return None
        files = sorted(name for name, m in top.items() if not m.is_dir)
        record: dict[str, Any] = {
            "version": CONTENTS_VERSION, "root": root, "files": files,
            "dirs": sorted(name for name, m in top.items() if m.is_dir),
            "texts": {}, "headers": {}, "dataset": None,
        }
        for name in sorted(files, key=lambda n: top[n].order):
            size = top[name].size
            if name in SMALL_FILES and size <= MAX_SMALL_FILE:
                record["texts"][name] = read(prefix + name, size).decode("utf-8", errors="replace")
            elif name.endswith(".safetensors"):
                record["headers"][name] = _header(read, prefix + name, size)
        if _looks_like_dataset(files):
            record["dataset"] = _profile_skeleton(top, read, prefix, root, max_rows)
        return record


def _header(read: Callable[..., bytes], member: str, size: int) -> dict[str, Any]:
    name = PurePosixPath(member).name
    head = read(member, 8)
    length = int.from_bytes(head[:8], "little") if len(head) == 8 else 0
    try:
        # A header longer than the file or cahp's cap is refused by its first 8 bytes alone, unread.
        data = read(member, 8 + length) if 8 + length <= size and length <= MAX_HEADER_BYTES else head
        shapes = safetensors_header(io.BytesIO(data), size, name=name)
    except CahpError as exc:
        return {"error": str(exc)}
    return {"shapes": {key: list(shape) for key, shape in shapes.items()}}


def _looks_like_dataset(files: list[str]) -> bool:
    return any(Path(name).suffix.lower() in FILE_SUFFIXES for name in files) or any(
        name in files for name in (*CARD_FILES, SAVED_DICT, SAVED_STATE))


def _profile_skeleton(top: dict[str, _Member], read: Callable[..., bytes], prefix: str, root: str,
                      max_rows: int | None) -> dict[str, Any]:
    """Profile the dataset on a skeleton of its top level: split files and cards real, other names empty."""
    keep = {*CARD_FILES, SAVED_DICT, SAVED_STATE}
    with tempfile.TemporaryDirectory(prefix="cahp-index-") as tmp:
        base = Path(tmp) / "dataset"
        base.mkdir()
        for name, member in top.items():
            target = base / name
            if member.is_dir:
                target.mkdir()
            elif name in keep or Path(name).suffix.lower() in FILE_SUFFIXES:
                read(prefix + name, member.size, target)  # streamed to the file, never whole in memory
            else:
                target.touch()
        profile = profile_directory(base, max_rows=max_rows).to_dict()
        label = "<dataset>" + (f"/{root}" if root else "")
        return relabel(profile, {str(base): label})


def _index_split_file(local: Path, suffix: str, max_rows: int | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="cahp-index-") as tmp:
        base = Path(tmp) / "dataset"
        base.mkdir()
        shutil.copyfile(local, base / f"{SPLIT_PLACEHOLDER}{suffix}")
        profile = profile_directory(base, max_rows=max_rows).to_dict()
        return {"version": CONTENTS_VERSION, "split": relabel(profile, {str(base): "<dataset>"})}


def relabel(value: Any, replacements: dict[str, str]) -> Any:
    """``value`` (JSON) with every string's occurrences of each key replaced by its label."""
    if isinstance(value, str):
        for old, new in replacements.items():
            value = value.replace(old, new)
        return value
    if isinstance(value, list):
        return [relabel(v, replacements) for v in value]
    if isinstance(value, dict):
        return {relabel(k, replacements): relabel(v, replacements) for k, v in value.items()}
    return value


@contextmanager
def _archive(path: Path) -> Iterator[tuple[list[_Member], Callable[..., bytes]]]:
    """The members of a zip or tar archive and ``read(name, n)``: the first ``n`` bytes of a member."""
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as zf:
            members = [_Member(_clean(i.filename), i.is_dir(), i.file_size, n) for n, i in enumerate(zf.infolist())]
            names = {_clean(i.filename): i for i in zf.infolist()}

            def read_zip(name: str, n: int, target: Path | None = None) -> bytes:
                with zf.open(names[name]) as handle:
                    return _take(handle, n, target)

            yield members, read_zip
        return
    with tarfile.open(path, "r:*") as tar:
        infos = {_clean(m.name): m for m in tar.getmembers() if m.isfile() or m.isdir()}
        members = [_Member(name, m.isdir(), m.size, n) for n, (name, m) in enumerate(infos.items())]

        def read_tar(name: str, n: int, target: Path | None = None) -> bytes:
            handle: IO[bytes] | None = tar.extractfile(infos[name])
            if handle is None:
                return b""
            with handle:
                return _take(handle, n, target)

        yield members, read_tar


def _take(handle: IO[bytes], n: int, target: Path | None) -> bytes:
    """The first ``n`` bytes of ``handle``; with ``target``, copied there in chunks instead (answers b"")."""
    if target is None:
        return handle.read(n)
    with open(target, "wb") as out:
        shutil.copyfileobj(_Limited(handle, n), out, 1024 * 1024)
    return b""


class _Limited(io.RawIOBase):
    """At most ``n`` bytes of a binary handle."""

    def __init__(self, handle: IO[bytes], n: int) -> None:
        self._handle, self._left = handle, n

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        size = self._left if size < 0 else min(size, self._left)
        data = self._handle.read(size)
        self._left -= len(data)
        return data


def _clean(name: str) -> str:
    return str(PurePosixPath(name.replace("\\", "/").lstrip("/"))).removeprefix("./")
