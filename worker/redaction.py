"""Keeping the worker's own paths out of what a caller reads: job errors, job logs, the report.

A job's inputs are unpacked under the worker's scratch directory, and engine messages name the
files they could not read. The caller needs the file's place in *their* model or dataset, not the
server's layout, so every line a caller can read passes through a :class:`Redactor` that rewrites
known server directories to short labels (``<model>/config.json``). Full details, paths and
tracebacks included, stay in the worker's own log.
"""

from __future__ import annotations

import os
import site
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from app.core.settings import Settings


@dataclass(frozen=True)
class Redactor:
    """Replaces each known directory (longest first) with its label."""

    replacements: tuple[tuple[str, str], ...]

    def __call__(self, text: str) -> str:
        for path, label in self.replacements:
            if path in text:
                text = text.replace(path, label)
        return text


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
