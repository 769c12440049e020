"""A whole pruning run: the steps in order, the accuracy budget, the typed report, plots and artifacts.

Reading order: ``_run`` (``run_pruning``) -> ``_steps`` (load, dense fine-tune, select, prune, recover,
evaluate) -> ``_budget`` (an accuracy budget instead of a knee) -> ``_deploy`` (ONNX, int8, cards)
-> ``_artifacts`` and ``_plots`` (the files) -> ``_report`` (``RunReport``, what ``report.json`` holds)."""

from ._artifacts import ARTIFACT_FILES
from ._budget import carve
from ._plots import plot_head_map, plot_layer_retention, plot_mss_curve
from ._report import FailedRunMetrics, FailedRunReport, RunError, RunReport, RunSummary
from ._run import run_pruning

__all__ = [
    "ARTIFACT_FILES", "carve", "FailedRunMetrics", "FailedRunReport", "plot_head_map", "plot_layer_retention",
    "plot_mss_curve", "run_pruning", "RunError", "RunReport", "RunSummary",
]
