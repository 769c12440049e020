"""Writing a result directory all at once: staged in a hidden sibling, renamed into place when complete.

``cahp prune`` and ``cahp export`` both write this way, so an interrupted or failed command never leaves
something that looks like a result. The staging directory comes from :func:`tempfile.mkdtemp`, which
makes it private (mode 0700), and some writers make their files private too (safetensors writes
0600); before the rename every directory in it is opened up to at least 0755 and every file to at
least 0644, because a model directory is meant to be read by the servers that load it, which seldom
run as the user that wrote it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cahp_engine.errors import InvalidInputError

#: Bits every published directory has: everyone may list and enter it.
DIRECTORY_BITS = 0o755
#: Bits every published file has: everyone may read it.
FILE_BITS = 0o644


def prepare_output_dir(output_dir: Path, *, overwrite: bool) -> None:
    """Refuse an existing non-empty directory unless ``overwrite``; never touch it otherwise."""
    if output_dir.exists() and not output_dir.is_dir():
        raise InvalidInputError(f"output {str(output_dir)!r} exists and is a file; name a directory")
    if output_dir.is_dir() and any(output_dir.iterdir()) and not overwrite:
        raise InvalidInputError(
            f"output directory {str(output_dir)!r} exists and is not empty; choose another or pass --overwrite"
        )


@contextmanager
def staged_output(output_dir: Path, *, publish_on: tuple[type[BaseException], ...] = ()) -> Iterator[Path]:
    """Yield a hidden sibling of ``output_dir`` to write into; publish it as ``output_dir`` at the end.

    Parameters
    ----------
    output_dir : Path
        The directory the caller promised (already checked by :func:`prepare_output_dir`). Replaced
        only once the block has finished.
    publish_on : tuple of exception types
        Exceptions after which the staged directory is published anyway (and the exception re-raised):
        a missed accuracy budget leaves its report and plots to say why. Any other exception removes it.
    """
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.partial-", dir=output_dir.parent))
    try:
        yield stage
    except publish_on:
        _publish(stage, output_dir)
        raise
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    _publish(stage, output_dir)


def _open_up(stage: Path) -> None:
    """Add read (and, for directories, enter) permission for everyone to everything under ``stage``."""
    for path in (stage, *stage.rglob("*")):
        if path.is_symlink():
            continue
        mode = path.stat().st_mode
        wanted = DIRECTORY_BITS if path.is_dir() else FILE_BITS
        if mode & wanted != wanted:
            path.chmod((mode | wanted) & 0o7777)


def _publish(stage: Path, output_dir: Path) -> None:
    try:
        _open_up(stage)
        if output_dir.exists():
            shutil.rmtree(output_dir)
        os.replace(stage, output_dir)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
