"""CAHP: Complementary Attention Head Pruning for Transformer encoder classifiers."""

from .config import PruningConfig
from .data import load_splits
from .export import export_onnx
from .models import load_classifier, load_pruned, prune_heads, save_pruned
from .run import RunHooks, RunReport, RunRequest, run_pruning
from .selection import analyze_heads, choose, select_heads

__all__ = [
    "PruningConfig", "analyze_heads", "choose", "export_onnx", "load_classifier", "load_pruned", "load_splits",
    "prune_heads", "run_pruning", "RunHooks", "RunReport", "RunRequest", "save_pruned", "select_heads",
]
