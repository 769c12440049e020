"""Where prometheus-client keeps the samples of a multi-process deployment (see :mod:`app.core.metrics`).

Separate from the metrics themselves because it must run before ``prometheus_client`` is imported:
that import decides, once, whether samples go to memory or to files.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"


def use_directory(path: Path, *, clear: bool = True) -> Path:
    """Make this process (and the processes it starts) write metrics under ``path``.

    Keeps a directory already set in the environment (an operator's choice). ``clear`` empties the
    directory first, so samples of an earlier run are not added to this one's.
    """
    existing = os.environ.get(MULTIPROCESS_ENV)
    if existing:
        return Path(existing)
    if clear and path.exists():
        shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True, exist_ok=True)
    os.environ[MULTIPROCESS_ENV] = str(path)
    return path
