"""Fixtures shared by every test package."""

from __future__ import annotations

import os

# Two busy processes on two cores oversubscribe torch/OpenMP threads; tests pin them.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402

torch.set_num_threads(1)

pytest_plugins = ["tests.service_fixtures"]
