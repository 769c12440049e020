"""Whether a run has a speed or FLOPs target, and whether the architecture can reach it at all: checked
right after the model loads, before any training (the target stage itself is in ``_target_stage``)."""

from __future__ import annotations

from torch import nn

from cahp_engine.allocation import TargetUnreachableError, check_target, flops_costs
from cahp_engine.config import PruningConfig


def has_target(config: PruningConfig) -> bool:
    """Whether ``config`` prunes to a speed or FLOPs target."""
    return config.target_speedup is not None or config.target_flops is not None


def check_target_reachable(model: nn.Module, config: PruningConfig) -> None:
    """Refuse, before any work, a target the architecture's FLOPs cannot reach (the reachable one named).

    A FLOPs target is checked exactly at ``target_batch`` x ``target_seq_len``. A speed target is checked
    against the FLOPs speed-up, an upper bound of the measured one (a runtime's fixed costs do not
    shrink); the measured bound is checked once the latency table is fitted. ``p95`` is checked at one
    token, where the bound is the loosest.
    """
    if not has_target(config):
        return
    p95 = not isinstance(config.target_seq_len, int)
    costs = flops_costs(model, batch_size=config.target_batch, seq_len=1 if p95 else int(config.target_seq_len))
    # The serving length is not known yet at ``p95``: the bound is named as what it is, not a 1-token shape.
    where = f"at batch {config.target_batch} and any serving length in FLOPs" if p95 else None
    try:
        check_target(costs, target_speedup=config.target_speedup, target_flops=config.target_flops, where=where)
    except TargetUnreachableError as exc:
        later = "; the p95 length is read from the data later" if p95 and config.target_speedup is not None else ""
        raise TargetUnreachableError(f"{exc} (counted in FLOPs before any work{later})", best=exc.best) from None
