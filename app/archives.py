"""Unpacking uploaded tar and zip archives without letting them write outside their directory.

Every member is checked before anything is written: no absolute names, no ``..``, no device files,
no links that leave the archive, and a cap on the member count and on the unpacked size (declared
sizes are what tar writes, and zip members are copied through a counter, so a bomb stops at the
cap). Tar extraction then also runs under Python's ``data`` filter as a second line of defence.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import stat
import tarfile
import zipfile
from pathlib import Path

from app.errors import InvalidUploadError

ARCHIVE_SUFFIXES: tuple[str, ...] = (".tar.gz", ".tgz", ".tar", ".zip")
_CHUNK = 1024 * 1024


def archive_suffix(name: str) -> str | None:
    """The archive suffix ``name`` ends with (``.tar.gz``, ``.tgz``, ``.tar``, ``.zip``), or None."""
    lower = name.lower()
    return next((s for s in ARCHIVE_SUFFIXES if lower.endswith(s)), None)


def unpack(archive: Path, dest: Path, *, max_bytes: int, max_members: int) -> Path:
    """Unpack ``archive`` into the new directory ``dest`` and return the content root.

    The root is ``dest``, or its only entry when the archive holds a single top-level directory
    (``tar czf model.tar.gz model/`` is the usual way to pack a model).

    Raises
    ------
    InvalidUploadError
        For an unreadable archive, an unsafe member, or limits exceeded; nothing is left in ``dest``.
    """
    dest.mkdir(parents=True, exist_ok=False)
    try:
        if zipfile.is_zipfile(archive):
            _unpack_zip(archive, dest, max_bytes=max_bytes, max_members=max_members)
        elif tarfile.is_tarfile(archive):
            _unpack_tar(archive, dest, max_bytes=max_bytes, max_members=max_members)
        else:
            raise InvalidUploadError(f"{archive.name} is not a tar or zip archive; pack the files with tar or zip")
        entries = [p for p in dest.iterdir() if not p.name.startswith(".") and p.name != "__MACOSX"]
        if not entries:
            raise InvalidUploadError(f"{archive.name} is empty; pack the model or dataset files into it")
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    if len(entries) == 1 and entries[0].is_dir():
        return entries[0]
    return dest


def _safe_name(name: str, archive: str) -> str:
    """Normalise a member name, refusing ones that would land outside the destination."""
    if not name or "\x00" in name:
        raise InvalidUploadError(f"{archive} has a member with an empty or invalid name")
    clean = name.replace("\\", "/")
    if clean.startswith("/") or (len(clean) > 1 and clean[1] == ":"):
        raise InvalidUploadError(f"{archive} has a member with an absolute path ({name!r}); pack relative paths")
    if ".." in clean.split("/"):
        raise InvalidUploadError(f"{archive} has a member whose path contains '..' ({name!r}); remove it")
    return posixpath.normpath(clean)


def _inside(link_from: str, target: str) -> bool:
    """Whether the link target, taken relative to the link's own directory, stays in the archive."""
    if target.startswith("/"):
        return False
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(link_from), target))
    return joined != ".." and not joined.startswith("../")


def check_archive(archive: Path, *, max_bytes: int, max_members: int) -> None:
    """Check every member of ``archive`` without unpacking it (InvalidUploadError if one is unsafe)."""
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as zf:
                _zip_members(zf, archive.name, max_bytes=max_bytes, max_members=max_members)
        elif tarfile.is_tarfile(archive):
            with tarfile.open(archive, "r:*") as tar:
                _tar_members(tar, archive.name, max_bytes=max_bytes, max_members=max_members)
        else:
            raise InvalidUploadError(f"{archive.name} is not a tar or zip archive; pack the files with tar or zip")
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as exc:
        raise InvalidUploadError(f"{archive.name} is truncated or corrupt: {exc}") from exc


def _tar_members(tar: tarfile.TarFile, name: str, *, max_bytes: int, max_members: int) -> list[tarfile.TarInfo]:
    total = 0
    members: list[tarfile.TarInfo] = []
    for member in tar:  # lazy: stops reading at the first member over the limits
        if len(members) >= max_members:
            raise InvalidUploadError(f"{name} has more than {max_members} members; pack fewer files")
        path = _safe_name(member.name, name)
        if member.issym() and not _inside(path, member.linkname):
            raise InvalidUploadError(f"{name}: link {member.name!r} points outside the archive ({member.linkname!r})")
        if member.islnk() and not _inside(".", _safe_name(member.linkname, name)):
            raise InvalidUploadError(f"{name}: hard link {member.name!r} points outside the archive")
        if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
            raise InvalidUploadError(f"{name}: {member.name!r} is a device or pipe; archives may hold files only")
        total += member.size
        if total > max_bytes:
            raise InvalidUploadError(f"{name} unpacks to more than {max_bytes} bytes, the limit")
        members.append(member)
    return members


def _zip_members(zf: zipfile.ZipFile, name: str, *, max_bytes: int, max_members: int) -> list[zipfile.ZipInfo]:
    infos = zf.infolist()
    if len(infos) > max_members:
        raise InvalidUploadError(f"{name} has more than {max_members} members; pack fewer files")
    for info in infos:
        _safe_name(info.filename, name)
        if stat.S_ISLNK(info.external_attr >> 16):
            raise InvalidUploadError(f"{name}: {info.filename!r} is a link; zip archives may hold files only")
    if sum(info.file_size for info in infos) > max_bytes:
        raise InvalidUploadError(f"{name} unpacks to more than {max_bytes} bytes, the limit")
    return infos


def _unpack_tar(archive: Path, dest: Path, *, max_bytes: int, max_members: int) -> None:
    name = archive.name
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = _tar_members(tar, name, max_bytes=max_bytes, max_members=max_members)
            tar.extractall(dest, members=members, filter="data")
    except tarfile.TarError as exc:
        raise InvalidUploadError(f"{name} cannot be unpacked: {exc}") from exc
    except (EOFError, OSError) as exc:
        raise InvalidUploadError(f"{name} is truncated or corrupt: {exc}") from exc


def _unpack_zip(archive: Path, dest: Path, *, max_bytes: int, max_members: int) -> None:
    name = archive.name
    try:
        with zipfile.ZipFile(archive) as zf:
            infos = _zip_members(zf, name, max_bytes=max_bytes, max_members=max_members)
            budget = max_bytes
            for info in infos:
                target = dest / _safe_name(info.filename, name)
                if info.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src, open(target, "xb") as out:
                    # Count what is really inflated: the declared size in the header may lie.
                    while chunk := src.read(_CHUNK):
                        budget -= len(chunk)
                        if budget < 0:
                            raise InvalidUploadError(f"{name} unpacks to more than {max_bytes} bytes, the limit")
                        out.write(chunk)
                os.chmod(target, 0o644)
    except zipfile.BadZipFile as exc:
        raise InvalidUploadError(f"{name} cannot be unpacked: {exc}") from exc
    except FileExistsError as exc:
        raise InvalidUploadError(f"{name} holds the same file twice ({exc.filename}); keep one") from exc
