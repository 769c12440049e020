"""Keeping a dataset directory's reader inside the directory.

Two formats name files for ``datasets`` to open: a repository's ``README.md`` (``configs`` with
``data_files`` and ``data_dir``) and a ``save_to_disk`` directory (``dataset_dict.json`` names split
directories, each split's ``state.json`` its Arrow files). ``datasets`` resolves those names against
the whole filesystem (absolute paths, ``..``, globs such as ``/x/**/*.csv``) and as fsspec URLs
(``https://``, ``hf://``, chained ``zip://...::...``). The checks here run before ``datasets`` sees
the directory, so that what it opens is a file inside the directory, reached through no link that
leads out of it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path, PureWindowsPath
from typing import Any

from cahp_engine._validation import is_plain_file_name
from cahp_engine.errors import DatasetError

#: A URL scheme (``https:``, ``hf:``, ``zip:``, ``data:``...); ``datasets`` treats any such prefix as a URL.
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")
#: The JSON files ``datasets.load_from_disk`` reads.
SAVED_DICT = "dataset_dict.json"
SAVED_STATE = "state.json"
SAVED_INFO = "dataset_info.json"


def data_file_problem(entry: Any) -> str | None:
    """Why ``entry`` (a ``data_files`` path or glob, or a ``data_dir``) cannot be used, or None if it can.

    Usable: a relative path or glob with ``/`` between its parts and no ``..`` part, such as
    ``data/train-*.parquet``; it is resolved inside the dataset directory.
    """
    if not isinstance(entry, str) or not entry.strip():
        return f"is {type(entry).__name__ if not isinstance(entry, str) else 'empty'}, not a path"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in entry):
        return "holds a control character"
    if "://" in entry or "::" in entry or _SCHEME.match(entry):
        return "is a URL"
    if entry.startswith(("/", "\\", "~")) or PureWindowsPath(entry).drive:
        return "is an absolute path"
    if "\\" in entry:
        return "holds a backslash (separate directories with /)"
    if ".." in entry.split("/"):
        return "leads out of the dataset directory with '..'"
    return None


def check_links_inside(root: Path, shown: str | None = None) -> None:
    """Refuse a directory holding a symbolic link (to a file or a directory) that resolves outside it.

    A glob such as ``data/**`` follows links, so a link inside the directory would take a reader
    anywhere; links between the directory's own files are fine.

    Raises
    ------
    DatasetError
        Naming the first link that leads out.
    """
    real_root = Path(os.path.realpath(root))
    for directory, dirnames, filenames in os.walk(root):  # links to directories are listed, not entered
        for name in (*dirnames, *filenames):
            entry = Path(directory, name)
            if entry.is_symlink() and not Path(os.path.realpath(entry)).is_relative_to(real_root):
                raise DatasetError(
                    f"{entry.relative_to(root).as_posix()!r} in {shown or root} is a link that leads out of the "
                    "dataset directory; copy the file itself into the directory"
                )


def check_saved_dataset(root: Path) -> None:
    """Refuse a ``save_to_disk`` directory whose JSON files name anything but its own files.

    ``dataset_dict.json``'s splits must be plain directory names of real directories in ``root``;
    each split's ``state.json`` must list plain file names (no directory part, not ``.`` or ``..``)
    of regular files in that split's directory; none of the JSON files may be a link. A ``root``
    holding ``state.json`` (a single saved ``Dataset``) is checked as a split.

    Raises
    ------
    DatasetError
        Naming the file and the entry, and saying how to write the directory again.
    """
    listing = root / SAVED_DICT
    if listing.exists() or listing.is_symlink():
        content = _json_file(listing, root)
        splits = content.get("splits")
        if not isinstance(splits, list):
            raise DatasetError(f"{listing} has no `splits` list; save the DatasetDict again with save_to_disk")
        for split in splits:
            directory = root / split if is_plain_file_name(split) else None
            if directory is None or directory.is_symlink() or not directory.is_dir():
                raise DatasetError(
                    f"{listing} names the split {split!r}, which is not a directory beside it; a split is a plain "
                    "directory name in the save_to_disk directory. Save the DatasetDict again with save_to_disk"
                )
            _check_saved_split(directory)
    if (root / SAVED_STATE).exists() or (root / SAVED_STATE).is_symlink():
        _check_saved_split(root)


def _check_saved_split(directory: Path) -> None:
    if (directory / SAVED_INFO).is_symlink():
        raise _link(directory / SAVED_INFO)
    state = _json_file(directory / SAVED_STATE, directory)
    files = state.get("_data_files")
    if not isinstance(files, list) or not files:
        raise DatasetError(
            f"{directory / SAVED_STATE} lists no `_data_files`; save the dataset again with save_to_disk"
        )
    for entry in files:
        name = entry.get("filename") if isinstance(entry, dict) else None
        path = directory / name if is_plain_file_name(name) else None
        if path is None or path.is_symlink() or not path.is_file():
            raise DatasetError(
                f"{directory / SAVED_STATE} names the data file {name!r}, which is not a file beside it; a data "
                "file is a plain file name in the split's directory. Save the dataset again with save_to_disk"
            )


def _link(path: Path) -> DatasetError:
    return DatasetError(
        f"{path.name} in {path.parent} is a link; save_to_disk writes regular files, so save the dataset again "
        "(or copy the file itself in place of the link)"
    )


def _json_file(path: Path, directory: Path) -> dict[str, Any]:
    if path.is_symlink():
        raise _link(path)
    if not path.is_file():
        raise DatasetError(f"{directory} has no {path.name}; save the dataset again with save_to_disk")
    try:
        content = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DatasetError(f"{path} cannot be read as JSON ({type(err).__name__}); save the dataset again") from None
    if not isinstance(content, dict):
        raise DatasetError(f"{path} holds a JSON {type(content).__name__}, not an object; save the dataset again")
    return content
