"""``file:///path``: a directory, archive or (datasets only) split file on the server itself.

Only under ``CAHP_ALLOWED_LOCAL_ROOTS``: the path is resolved (following links), and so is every
file below a directory, since a link inside a root may lead anywhere. A file with more than one
hard link is refused too: the other name may be outside the roots, and nothing on the file says
where. Checked at submit and again in the worker, because files can change in between. A dataset's
own files (a ``README.md`` listing ``data_files``, ``save_to_disk`` JSON) are checked at submit
as the engine checks them when the job runs (:mod:`app.core.inputs._dataset_checks`).
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

from app.core.errors import InvalidReferenceError
from app.core.inputs._dataset_checks import check_dataset_archive, check_dataset_directory
from app.core.inputs.sources._base import (
    DATA_SUFFIXES,
    Fetched,
    Reference,
    Role,
    Shape,
    SourceContext,
    has_control,
    shape_of_name,
)
from app.core.settings import Settings

SCHEME = "file"


def parse(uri: str, rest: str, *, role: Role) -> Reference:
    parts = urlsplit(uri)
    if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
        raise InvalidReferenceError(f"{uri!r} must be an absolute local path like file:///data/models/x")
    if parts.query or parts.fragment:
        raise InvalidReferenceError(f"{uri!r} must not have a query or fragment")
    path = unquote(parts.path)
    if has_control(path):
        raise InvalidReferenceError(f"{uri!r} decodes to a path with a NUL or another control character")
    return Reference(uri, SCHEME, path)


def check(ref: Reference, *, role: Role, context: SourceContext) -> Shape:
    fetched = _local(ref, context.settings)
    if role == "dataset" and fetched.shape == "directory":
        check_dataset_directory(fetched.local, shown=f"file://{ref.target}")
    elif role == "dataset" and fetched.shape == "archive":
        with open(fetched.local, "rb") as archive:
            check_dataset_archive(archive, shown=ref.uri, max_members=context.settings.max_archive_members)
    return fetched.shape


def fetch(ref: Reference, *, dest: Path, context: SourceContext) -> Fetched:
    return _local(ref, context.settings)


def _local(ref: Reference, settings: Settings) -> Fetched:
    path = resolve_local(ref.target, settings)
    if path.is_dir():
        return Fetched(str(path), "directory")
    shape = shape_of_name(path.name)
    if shape == "directory":
        raise InvalidReferenceError(
            f"{ref.uri} is a file that is neither an archive (.tar.gz, .tgz, .tar, .zip) nor a split file "
            f"({', '.join(DATA_SUFFIXES)})"
        )
    return Fetched(str(path), shape)


def _outside_roots(path: str) -> InvalidReferenceError:
    # The same words whether or not the path exists, and without naming the roots: a caller learns
    # nothing about the server's files outside the directories it may read.
    return InvalidReferenceError(
        f"file://{path} is not in a directory this server may read; ask the operator which directories "
        "CAHP_ALLOWED_LOCAL_ROOTS allows, or upload the files with POST /v1/uploads"
    )


def _under_roots(path: Path, settings: Settings) -> bool:
    return any(path.is_relative_to(root) for root in settings.allowed_local_roots)


def resolve_local(path: str, settings: Settings) -> Path:
    """Resolve a ``file://`` path, following symlinks, and require it to be under an allowed root.

    Only a path that resolves inside a root is said to be missing; anything else gets one message.
    """
    if not settings.allowed_local_roots:
        raise InvalidReferenceError(
            "file:// references are disabled on this server; an operator can allow directories with "
            "CAHP_ALLOWED_LOCAL_ROOTS, or upload the files with POST /v1/uploads"
        )
    try:
        resolved = Path(path).resolve(strict=False)
    except (RuntimeError, OSError, ValueError) as exc:  # a symlink loop, or a name the OS refuses
        raise _outside_roots(path) from exc
    if not _under_roots(resolved, settings):
        raise _outside_roots(path)
    if not resolved.exists():
        raise InvalidReferenceError(f"file://{path} does not exist on the server")
    if resolved.is_file():
        _refuse_hard_link(resolved, f"file://{path}")
    check_local_tree(resolved, settings, shown=path)
    return resolved


def _refuse_hard_link(path: Path, shown: str) -> None:
    links = path.stat().st_nlink
    if links > 1:
        raise InvalidReferenceError(
            f"{shown} is a file with {links} hard links; another of its names may lie outside the directories "
            "this server may read, so cahp refuses it. Copy the file in instead of linking it"
        )


def check_local_tree(path: Path, settings: Settings, *, shown: str) -> None:
    """Require every file under the directory ``path`` to resolve inside an allowed root.

    A symlink inside a root may point anywhere; what is read is where it leads, so each entry is
    resolved (directories reached through links are walked too, once each). A regular file with
    more than one hard link is refused: its other names may be anywhere on the filesystem. The walk
    stops at ``CAHP_MAX_ARCHIVE_MEMBERS`` entries.
    """
    if not path.is_dir():
        return
    seen: set[str] = set()
    count = 0
    for directory, dirnames, filenames in os.walk(path, followlinks=True):
        real_dir = os.path.realpath(directory)
        if real_dir in seen:
            dirnames[:] = []
            continue
        seen.add(real_dir)
        for name in (*dirnames, *filenames):
            count += 1
            if count > settings.max_archive_members:
                raise InvalidReferenceError(
                    f"file://{shown} holds more than {settings.max_archive_members} files; point at a smaller directory"
                )
            entry = Path(directory, name)
            if entry.is_symlink() and not _under_roots(Path(os.path.realpath(entry)), settings):
                relative = entry.relative_to(path).as_posix()
                raise InvalidReferenceError(
                    f"file://{shown}: {relative!r} is a link that leads out of the directories this server may "
                    "read; copy the file itself there"
                )
            if name in filenames and entry.is_file():
                _refuse_hard_link(entry, f"file://{shown}: {entry.relative_to(path).as_posix()!r}")
