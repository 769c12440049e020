"""Unpacking uploaded tar and zip archives without letting them write or read outside their directory.

The rule (docs/operations.md, "Archives"): an archive holds regular files and directories only.
Every member is checked before anything is written: no absolute names, no ``..``, no symbolic or
hard links of any kind (pack with ``tar -h``, which stores the files links point to), no device
files or pipes, and caps on the member count and on the unpacked size. Extraction then writes the
validated members itself, one regular file at a time, into directories it created; it never calls
``tarfile``'s ``extract``/``extractall``, whose ``data`` filter is defeated on Python releases before
3.11.13 / 3.12.11 / 3.13.4 by link chains longer than ``PATH_MAX`` (CVE-2025-4517, CVE-2025-4330,
CVE-2025-4138). With no link ever written, no later member can be redirected out of the directory by
any route, whatever the Python.
"""

from __future__ import annotations

import errno
import os
import posixpath
import shutil
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from app.core.errors import InsufficientStorageError, InvalidUploadError

ARCHIVE_SUFFIXES: tuple[str, ...] = (".tar.gz", ".tgz", ".tar", ".zip")
_CHUNK = 1024 * 1024
#: Errors that mean the server's disk, not the archive, is the problem.
_STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_LINK_ADVICE = ("archives may hold files and directories only; pack with `tar -h` (or zip) to store the files "
                "links point to")


def archive_suffix(name: str) -> str | None:
    """The archive suffix ``name`` ends with (``.tar.gz``, ``.tgz``, ``.tar``, ``.zip``), or None."""
    lower = name.lower()
    return next((s for s in ARCHIVE_SUFFIXES if lower.endswith(s)), None)


def storage_error(exc: OSError, what: str) -> InsufficientStorageError | None:
    """An :class:`InsufficientStorageError` when ``exc`` is a full disk or quota, else None."""
    if exc.errno in _STORAGE_ERRNOS:
        return InsufficientStorageError(f"the server ran out of disk space while {what}; try again later")
    return None


def _not_an_archive(name: str) -> InvalidUploadError:
    return InvalidUploadError(f"{name} is not a tar or zip archive; pack the files with tar or zip")


def _unreadable(exc: OSError, name: str, doing: str) -> InsufficientStorageError | InvalidUploadError:
    """What an OSError while ``doing`` (``unpacking``, ``reading``) the archive ``name`` means: a full disk is
    the server's, anything else a truncated or corrupt archive."""
    full = storage_error(exc, f"{doing} {name}")
    return full if full is not None else InvalidUploadError(f"{name} is truncated or corrupt ({type(exc).__name__})")


def unpack(archive: Path, dest: Path, *, max_bytes: int, max_members: int) -> Path:
    """Unpack ``archive`` into the new directory ``dest`` and return the content root.

    The root is ``dest``, or its only entry when the archive holds a single top-level directory
    (``tar czf model.tar.gz model/`` is the usual way to pack a model).

    Raises
    ------
    InvalidUploadError
        For an unreadable archive, an unsafe member, or limits exceeded; nothing is left in ``dest``.
    InsufficientStorageError
        When the disk fills up while unpacking; nothing is left in ``dest``.
    """
    dest.mkdir(parents=True, exist_ok=False)
    try:
        try:
            if zipfile.is_zipfile(archive):
                _unpack_zip(archive, dest, max_bytes=max_bytes, max_members=max_members)
            elif tarfile.is_tarfile(archive):
                _unpack_tar(archive, dest, max_bytes=max_bytes, max_members=max_members)
            else:
                raise _not_an_archive(archive.name)
        except OSError as exc:
            raise _unreadable(exc, archive.name, "unpacking") from exc
        entries = [p for p in dest.iterdir() if not p.name.startswith(".") and p.name != "__MACOSX"]
        if not entries:
            raise InvalidUploadError(f"{archive.name} is empty; pack the model or dataset files into it")
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    if len(entries) == 1 and entries[0].is_dir():
        return entries[0]
    return dest


def read_root_files(
    archive: IO[bytes], names: tuple[str, ...], *, max_bytes: int, max_members: int
) -> dict[str, bytes]:
    """Read the files ``names`` at the root :func:`unpack` would return, without unpacking anything.

    ``archive`` is a seekable binary file (a tar, compressed or not, or a zip). Only regular files of
    at most ``max_bytes`` bytes are read; the root is found by :func:`unpack`'s rule (the archive's
    only top-level directory, hidden entries and ``__MACOSX`` aside, or the archive itself). An
    archive that cannot be read, or that :func:`check_archive` would refuse, gives ``{}``: the
    unpacker says what is wrong with it when the job runs.
    """
    found: dict[str, bytes] = {}
    tops: dict[str, bool] = {}  # top-level entry -> is a directory

    def wanted(path: str, is_dir: bool, size: int) -> bool:
        parts = path.split("/")
        tops[parts[0]] = tops.get(parts[0], False) or is_dir or len(parts) > 1
        return not is_dir and len(parts) <= 2 and parts[-1] in names and size <= max_bytes

    try:
        archive.seek(0)
        if zipfile.is_zipfile(archive):
            archive.seek(0)
            with zipfile.ZipFile(archive) as zf:
                infos = zf.infolist()
                if len(infos) > max_members:
                    return {}
                for info in infos:
                    path = _safe_name(info.filename, "archive")
                    if wanted(path, info.is_dir(), info.file_size):
                        with zf.open(info) as source:
                            found[path] = source.read(max_bytes + 1)
        else:
            archive.seek(0)
            with tarfile.open(fileobj=archive, mode="r:*") as tar:
                for count, member in enumerate(tar, start=1):
                    if count > max_members or not (member.isfile() or member.isdir()):
                        return {}
                    path = _safe_name(member.name, "archive")
                    if wanted(path, member.isdir(), member.size):
                        handle = tar.extractfile(member)
                        if handle is not None:
                            found[path] = handle.read(max_bytes + 1)
    except (InvalidUploadError, OSError, RuntimeError, NotImplementedError, EOFError, zlib.error,
            tarfile.TarError, zipfile.BadZipFile):
        return {}
    visible = [top for top in tops if top != "." and not top.startswith(".") and top != "__MACOSX"]
    prefix = f"{visible[0]}/" if len(visible) == 1 and tops[visible[0]] else ""
    return {name: found[prefix + name] for name in names if len(found.get(prefix + name, b"")) <= max_bytes
            and prefix + name in found}


def _safe_name(name: str, archive: str) -> str:
    """Normalise a member name, refusing ones that would land outside the destination."""
    if not name or any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        raise InvalidUploadError(f"{archive} has a member with an empty name or a control character in it")
    clean = name.replace("\\", "/")
    if clean.startswith("/") or (len(clean) > 1 and clean[1] == ":"):
        raise InvalidUploadError(f"{archive} has a member with an absolute path ({name!r}); pack relative paths")
    if ".." in clean.split("/"):
        raise InvalidUploadError(f"{archive} has a member whose path contains '..' ({name!r}); remove it")
    normal = posixpath.normpath(clean)
    if normal in (".", ""):
        return "."
    return normal


def check_archive(archive: Path, *, max_bytes: int, max_members: int, shown: str | None = None) -> None:
    """Check every member of ``archive`` without unpacking it (InvalidUploadError if one is unsafe).

    Everything the unpacker would refuse is refused here, at upload, so that a caller hears of it at
    once rather than from a failed job: unsafe members, the limits, and a layout that cannot be
    written (a file named twice, or a name used both as a file and a directory). ``shown`` is the
    name the caller knows the archive by, used in the messages (default: the file's own name).
    """
    name = shown or archive.name
    layout = _Layout(name)
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as zf:
                for info in _zip_members(zf, name, max_bytes=max_bytes, max_members=max_members):
                    layout.add(_safe_name(info.filename, name), is_dir=info.is_dir())
        elif tarfile.is_tarfile(archive):
            with tarfile.open(archive, "r:*") as tar:
                for path, member in _tar_members(tar, name, max_bytes=max_bytes, max_members=max_members):
                    layout.add(path, is_dir=member.isdir())
        else:
            raise _not_an_archive(name)
    except OSError as exc:
        raise _unreadable(exc, name, "reading") from exc
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error) as exc:
        raise InvalidUploadError(f"{name} is truncated or corrupt ({type(exc).__name__})") from exc


class _Layout:
    """The files and directories an archive would create, to refuse one the unpacker could not write."""

    def __init__(self, archive: str) -> None:
        self.archive = archive
        self.files: set[str] = set()
        self.dirs: set[str] = set()

    def _clash(self, relative: str) -> InvalidUploadError:
        return InvalidUploadError(f"{self.archive} holds {relative!r} both as a file and a directory")

    def add(self, relative: str, *, is_dir: bool) -> None:
        if relative == ".":
            if not is_dir:
                raise InvalidUploadError(f"{self.archive} has a file member without a name")
            return
        parent = posixpath.dirname(relative)
        while parent and parent not in self.dirs:
            if parent in self.files:
                raise self._clash(parent)
            self.dirs.add(parent)
            parent = posixpath.dirname(parent)
        if parent in self.files:
            raise self._clash(parent)
        if is_dir:
            if relative in self.files:
                raise self._clash(relative)
            self.dirs.add(relative)
        elif relative in self.dirs:
            raise self._clash(relative)
        elif relative in self.files:
            raise InvalidUploadError(f"{self.archive} holds {relative!r} twice; keep one")
        else:
            self.files.add(relative)


def _tar_members(
    tar: tarfile.TarFile, name: str, *, max_bytes: int, max_members: int
) -> Iterator[tuple[str, tarfile.TarInfo]]:
    """Yield ``(normalised name, member)`` for each member, refusing the first unsafe one."""
    total = count = 0
    for member in tar:  # lazy: stops reading at the first member over the limits
        count += 1
        if count > max_members:
            raise InvalidUploadError(f"{name} has more than {max_members} members; pack fewer files")
        path = _safe_name(member.name, name)
        if member.issym() or member.islnk():
            kind = "symbolic link" if member.issym() else "hard link"
            raise InvalidUploadError(f"{name}: {member.name!r} is a {kind}; {_LINK_ADVICE}")
        if not (member.isfile() or member.isdir()):
            raise InvalidUploadError(f"{name}: {member.name!r} is a device or pipe; {_LINK_ADVICE}")
        total += member.size
        if total > max_bytes:
            raise InvalidUploadError(f"{name} unpacks to more than {max_bytes} bytes, the limit")
        yield path, member


def _zip_members(zf: zipfile.ZipFile, name: str, *, max_bytes: int, max_members: int) -> list[zipfile.ZipInfo]:
    infos = zf.infolist()
    if len(infos) > max_members:
        raise InvalidUploadError(f"{name} has more than {max_members} members; pack fewer files")
    for info in infos:
        _safe_name(info.filename, name)
        mode = info.external_attr >> 16
        if stat.S_ISLNK(mode):
            raise InvalidUploadError(f"{name}: {info.filename!r} is a symbolic link; {_LINK_ADVICE}")
        # Many zip writers store permission bits only; a file type, when present, must be file or directory.
        if stat.S_IFMT(mode) and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise InvalidUploadError(f"{name}: {info.filename!r} is a device or pipe; {_LINK_ADVICE}")
    if sum(info.file_size for info in infos) > max_bytes:
        raise InvalidUploadError(f"{name} unpacks to more than {max_bytes} bytes, the limit")
    return infos


class _Writer:
    """Writes regular files and directories under ``root`` and nothing else.

    Each parent directory is created here (never taken from the archive), and every file is opened
    with ``O_NOFOLLOW | O_EXCL``, so even a link planted by something else could not be written
    through. The byte budget counts what is really written: a header's declared size may lie.
    """

    def __init__(self, root: Path, archive: str, max_bytes: int) -> None:
        self.root = root
        self.real_root = os.path.realpath(root)
        self.archive = archive
        self.max_bytes = max_bytes
        self.budget = max_bytes

    def _target(self, relative: str) -> Path:
        target = self.root / relative
        # Belt and braces: the normalised name cannot leave the root, and no link exists to follow.
        if os.path.commonpath([self.real_root, os.path.realpath(target)]) != self.real_root:
            raise InvalidUploadError(f"{self.archive}: {relative!r} would be written outside the archive's directory")
        return target

    def directory(self, relative: str) -> None:
        if relative == ".":
            return
        target = self._target(relative)
        try:
            target.mkdir(mode=0o755, parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError) as exc:
            raise InvalidUploadError(f"{self.archive} holds {relative!r} both as a file and a directory") from exc

    def file(self, relative: str, source: IO[bytes]) -> None:
        if relative == ".":
            raise InvalidUploadError(f"{self.archive} has a file member without a name")
        parent = posixpath.dirname(relative)
        if parent:
            self.directory(parent)
        target = self._target(relative)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(target, flags, 0o644)
        except FileExistsError as exc:
            if os.path.isdir(target):
                raise InvalidUploadError(f"{self.archive} holds {relative!r} both as a file and a directory") from exc
            raise InvalidUploadError(f"{self.archive} holds {relative!r} twice; keep one") from exc
        except (IsADirectoryError, NotADirectoryError) as exc:
            raise InvalidUploadError(f"{self.archive} holds {relative!r} both as a file and a directory") from exc
        with os.fdopen(fd, "wb") as out:
            while chunk := source.read(_CHUNK):
                self.budget -= len(chunk)
                if self.budget < 0:
                    raise InvalidUploadError(f"{self.archive} unpacks to more than {self.max_bytes} bytes, the limit")
                out.write(chunk)


def _unpack_tar(archive: Path, dest: Path, *, max_bytes: int, max_members: int) -> None:
    name = archive.name
    writer = _Writer(dest, name, max_bytes)
    try:
        with tarfile.open(archive, "r:*") as tar:
            for path, member in _tar_members(tar, name, max_bytes=max_bytes, max_members=max_members):
                if member.isdir():
                    writer.directory(path)
                    continue
                source = tar.extractfile(member)
                if source is None:  # not reachable for a regular file; refuse rather than guess
                    raise InvalidUploadError(f"{name}: {member.name!r} cannot be read as a file")
                with source:
                    writer.file(path, source)
    except (tarfile.TarError, EOFError, zlib.error) as exc:
        raise InvalidUploadError(f"{name} cannot be unpacked ({type(exc).__name__}); it is truncated or corrupt") \
            from exc


def _unpack_zip(archive: Path, dest: Path, *, max_bytes: int, max_members: int) -> None:
    name = archive.name
    writer = _Writer(dest, name, max_bytes)
    try:
        with zipfile.ZipFile(archive) as zf:
            for info in _zip_members(zf, name, max_bytes=max_bytes, max_members=max_members):
                path = _safe_name(info.filename, name)
                if info.is_dir():
                    writer.directory(path)
                    continue
                try:
                    with zf.open(info) as source:
                        writer.file(path, source)
                except (RuntimeError, NotImplementedError) as exc:  # encrypted, or an unknown compression
                    raise InvalidUploadError(
                        f"{name}: {info.filename!r} is encrypted or compressed with a method zip cannot read; "
                        "pack it again without a password, with deflate"
                    ) from exc
    except (zipfile.BadZipFile, EOFError, zlib.error) as exc:
        raise InvalidUploadError(f"{name} cannot be unpacked ({type(exc).__name__}); it is truncated or corrupt") \
            from exc
