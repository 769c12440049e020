"""Keeping the worker's own paths out of what a caller reads: job errors, job logs, the JSON artifacts.

A job's inputs are unpacked under the worker's scratch directory, and engine messages name the
files they could not read. The caller needs the file's place in *their* model or dataset, not the
server's layout, so every line a caller can read, and every string of the JSON artifacts
(``report.json``...), passes through a :class:`Redactor` that rewrites known server directories to
short labels (``<model>/config.json``). Full details, paths and tracebacks included, stay in the
worker's own log.
"""

from __future__ import annotations

import json
import os
import re
import site
import sys
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.core.security import hide_credentials
from app.core.settings import Settings

#: A character that continues a file name: a directory is replaced only where none is next to it,
#: so ``/home/al`` is not found in ``/home/alice`` nor in ``/x/home/al``.
_NAME_CHAR = r"[\w.+\-@~%]"


@dataclass(frozen=True)
class Redactor:
    """Replaces each known directory with its label, where the directory is a whole path prefix.

    A directory matches only at a path boundary: not after a character of a file name, and followed
    by ``/`` or by anything but a character of a file name (the end, a space, a quote, ``:``...). At
    each place the longest directory that matches wins, and the text is read once, so a label is
    never rewritten by a shorter directory.
    """

    replacements: tuple[tuple[str, str], ...]
    _pattern: re.Pattern[str] | None = field(init=False, repr=False, compare=False, default=None)
    _labels: dict[str, str] = field(init=False, repr=False, compare=False, default_factory=dict)

    def __post_init__(self) -> None:
        labels = {path: label for path, label in self.replacements if path}
        if labels:
            alternatives = "|".join(re.escape(path) for path in sorted(labels, key=len, reverse=True))
            pattern = re.compile(rf"(?<!{_NAME_CHAR})(?:{alternatives})(?!{_NAME_CHAR})")
            object.__setattr__(self, "_pattern", pattern)
            object.__setattr__(self, "_labels", labels)

    def __call__(self, text: str) -> str:
        text = hide_credentials(text)  # an operator's URL with user:password@ in it (the MLflow server's)
        if self._pattern is None:
            return text
        return self._pattern.sub(lambda match: self._labels[match.group(0)], text)


def redact_json_file(path: Path, redact: Callable[[str], str]) -> bool:
    """Pass every string (and key) of the JSON file at ``path`` through ``redact``; rewrite it only if one changed.

    A file with no server path keeps its bytes; one with a server path is written back as the engine
    writes JSON (two-space indent, keys in their order), so only the redacted strings differ.
    Returns whether the file was rewritten.
    """
    changed = False

    def walk(value: Any) -> Any:
        nonlocal changed
        if isinstance(value, str):
            redacted = redact(value)
            changed = changed or redacted != value
            return redacted
        if isinstance(value, list):
            return [walk(item) for item in value]
        if isinstance(value, dict):
            return {walk(key): walk(item) for key, item in value.items()}
        return value

    text = path.read_text(encoding="utf-8")
    try:
        document = walk(json.loads(text))
    except ValueError:  # not JSON after all: redacted as text
        redacted = redact(text)
        changed = redacted != text
        if changed:
            path.write_text(redacted, encoding="utf-8")
        return changed
    if changed:
        path.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    return changed


def job_redactor(settings: Settings, workdir: Path) -> Redactor:
    """The redactor for one attempt whose scratch directory is ``workdir``."""
    inputs = workdir / "inputs"
    labelled: list[tuple[Path | str | None, str]] = [
        (inputs / "model", "<model>"),
        (inputs / "dataset", "<dataset>"),
        (inputs, "<inputs>"),
        (workdir / "output", "<output>"),
        (workdir, "<job>"),
        (settings.resolved_work_dir, "<work>"),
        (settings.hub_cache_dir, "<hub-cache>"),
        (settings.spool_dir, "<spool>"),
        (settings.data_dir, "<data>"),
        *((p, "<python>") for p in _python_dirs()),
        (Path.home(), "~"),
    ]
    pairs: dict[str, str] = {}
    for path, label in labelled:
        if path is None:
            continue
        for form in {str(path), os.path.realpath(path)}:
            if len(form) > 1:  # never "/": that would rewrite every path
                pairs.setdefault(form.rstrip("/"), label)
    return Redactor(tuple(sorted(pairs.items(), key=lambda item: -len(item[0]))))


def _python_dirs() -> list[str]:
    paths = sysconfig.get_paths()
    dirs = {paths.get(name, "") for name in ("purelib", "platlib", "stdlib", "platstdlib")}
    dirs.update(getattr(site, "getsitepackages", list)())
    dirs.update({sys.prefix, sys.base_prefix, sys.exec_prefix})
    return sorted(d for d in dirs if d)
