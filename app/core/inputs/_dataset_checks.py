"""Submit-time checks of what a dataset's own files ask ``datasets`` to open.

A repository's ``README.md`` (or ``.huggingface.yaml``) lists ``data_files`` and ``data_dir``; a
``save_to_disk`` directory's JSON files name split directories and Arrow files. The engine refuses
any that lead outside the dataset before it reads a byte (:mod:`cahp_engine.data._card`,
:mod:`cahp_engine.data._paths`), and the worker runs those checks on every job; here the same
rules run when the job is submitted, so that the caller hears of the problem at once
(``422 invalid_dataset``). A directory on the server is checked as the engine would check it; an
archive (an upload, or a ``file://`` or ``s3://`` object) has its cards read from the root it would
unpack to, without unpacking it.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import IO

from app.core.inputs._archives import read_root_files
from cahp_engine.data import (
    CARD_FILES,
    SAVED_DICT,
    SAVED_STATE,
    check_card_text,
    check_repository,
    check_saved_dataset,
    has_card_configs,
)
from cahp_engine.errors import DatasetError

#: Largest card read from an archive at submit; a larger one is left to the worker's check.
MAX_CARD_BYTES = 4 * 1024 * 1024
#: Read-ahead of an archive read in ranges from a store (one request per this many bytes).
_READ_AHEAD = 8 * 1024 * 1024


def check_dataset_directory(path: Path, *, shown: str) -> None:
    """Check a dataset directory's cards and ``save_to_disk`` files; messages name it ``shown``.

    Raises
    ------
    DatasetError
        As the engine would when the job runs.
    """
    try:
        if has_card_configs(path):
            check_repository(path)
        if (path / SAVED_DICT).exists() or (path / SAVED_STATE).exists():
            check_saved_dataset(path)
    except DatasetError as exc:
        raise DatasetError(str(exc).replace(str(path), shown)) from None


def check_dataset_archive(archive: IO[bytes], *, shown: str, max_members: int) -> None:
    """Check the cards at the root of the seekable ``archive``; messages name it ``shown``.

    Raises
    ------
    DatasetError
        For a card whose YAML is malformed or whose ``data_files``/``data_dir`` lead out of the dataset.
    """
    cards = read_root_files(archive, CARD_FILES, max_bytes=MAX_CARD_BYTES, max_members=max_members)
    for name, content in cards.items():
        check_card_text(name, content.decode("utf-8", errors="replace"), where=f"{shown}: {name}")


def check_card_bytes(name: str, content: bytes, *, shown: str) -> None:
    """Check one card file's content (``README.md`` or ``.huggingface.yaml``) read from elsewhere."""
    check_card_text(name, content.decode("utf-8", errors="replace"), where=f"{shown}: {name}")


def ranged_file(read_range: Callable[[int, int], bytes], size: int) -> IO[bytes]:
    """A seekable binary file over an object read by ``read_range(start, end_inclusive)``."""
    return io.BufferedReader(_Ranged(read_range, size), buffer_size=_READ_AHEAD)


class _Ranged(io.RawIOBase):
    def __init__(self, read_range: Callable[[int, int], bytes], size: int) -> None:
        self._read_range = read_range
        self._size = size
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        if self._pos >= self._size or len(buffer) == 0:
            return 0
        data = self._read_range(self._pos, min(self._pos + len(buffer), self._size) - 1)
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)
