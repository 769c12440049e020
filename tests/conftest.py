"""What every test package shares: pinned threads, the suite-wide fixtures, and the tiers.

Two tiers: everything (``bin/dev test``, what CI runs), and the quick tier (``bin/dev test -m "not slow"``),
which leaves out the folders of tests that start real processes, browsers or long trainings
(:data:`SLOW_FOLDERS`) and the tests marked ``slow`` one by one.
"""

from __future__ import annotations

import os
from pathlib import Path

# Two busy processes on two cores oversubscribe torch/OpenMP threads; tests pin them.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

pytest_plugins = ["tests.support.fixtures"]

#: Folders whose every test is ``slow``: real worker and server processes, browsers, benchmark smoke runs.
SLOW_FOLDERS = ("reliability", "e2e", "ui", "bench")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(__file__).parent
    for item in items:
        parts = item.path.relative_to(root).parts if item.path.is_relative_to(root) else ()
        if parts and parts[0] in SLOW_FOLDERS:
            item.add_marker(pytest.mark.slow)
