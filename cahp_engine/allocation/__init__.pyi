"""Pruning to a cost target: heads and feed-forward neurons allocated per layer by importance per unit cost.

Reading order: ``_importance`` (``unit_importance``) -> ``_runtimes`` (``runner``) -> ``_costs``
(``flops_costs``, ``latency_costs``)
-> ``_allocate`` (``allocate``) -> ``_target`` (``prune_to_target``)."""

from ._allocate import Allocation, TargetUnreachableError, allocate, check_target, reachable, validate_target
from ._costs import CostModel, flops_costs, latency_costs
from ._importance import IMPORTANCE_KINDS, UnitImportance, unit_importance
from ._runtimes import RUNTIMES, median_seconds, runner
from ._target import TargetResult, prune_to_target, serving_length, time_pair

__all__ = [
    "IMPORTANCE_KINDS", "RUNTIMES", "Allocation", "allocate", "check_target", "CostModel", "flops_costs",
    "latency_costs", "median_seconds", "prune_to_target", "reachable", "runner", "serving_length", "TargetResult",
    "TargetUnreachableError", "time_pair", "UnitImportance", "unit_importance", "validate_target",
]
