"""CAHP: Complementary Attention Head Pruning for Transformer encoder classifiers.

The most used names are importable from the package; they load their modules on first use so that
``import cahp_engine`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "PruningConfig",
    "load_pruned",
    "save_pruned",
    "prune_heads",
    "select_heads",
    "analyze_heads",
    "choose",
    "run_pruning",
    "RunReport",
    "load_classifier",
    "load_splits",
    "export_onnx",
]

_LOCATIONS = {
    "PruningConfig": "cahp_engine.config",
    "load_pruned": "cahp_engine.checkpoint",
    "save_pruned": "cahp_engine.checkpoint",
    "prune_heads": "cahp_engine.surgery",
    "select_heads": "cahp_engine.pipeline",
    "analyze_heads": "cahp_engine.analysis",
    "choose": "cahp_engine.strategies",
    "run_pruning": "cahp_engine.run",
    "RunReport": "cahp_engine.report",
    "load_classifier": "cahp_engine.models",
    "load_splits": "cahp_engine.datasets_io",
    "export_onnx": "cahp_engine.export",
}


def __getattr__(name: str) -> Any:
    if name in _LOCATIONS:
        return getattr(importlib.import_module(_LOCATIONS[name]), name)
    raise AttributeError(f"module 'cahp_engine' has no attribute {name!r}")
