"""What selection measured beside its choice: how many samples each pass read (:mod:`._convergence`), how stable
the choice is (:mod:`._stability`) and how a consensus strategy's analyses agreed (:mod:`._consensus`). Light:
importable without torch or numpy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar

from cahp_engine.results import JsonRecord


@dataclass(frozen=True)
class SamplingRecord(JsonRecord):
    """How many training samples one pass of head selection read, and why it stopped there.

    ``mode`` is ``auto`` (a stopping rule decided) or ``fixed`` (an explicit amount, used exactly).
    ``stopped`` is ``converged`` (the rule was met), ``plateau`` (the noise share stopped falling
    before it was), ``cap`` (every row was read before either) or ``requested`` (a fixed amount).
    ``rungs`` are the sample counts at which the rule looked (the rungs of its ladder) and ``measures`` its
    measure (the noise share) at each of them. A report written when they were named ``checkpoints`` reads
    as well.
    """

    RENAMED_KEYS: ClassVar[Mapping[str, str]] = MappingProxyType({"checkpoints": "rungs"})

    mode: str
    samples: int
    available: int
    stopped: str
    reason: str
    rungs: tuple[int, ...] = ()
    measures: tuple[float | None, ...] = ()


@dataclass(frozen=True)
class StabilityRecord(JsonRecord):
    """How much the selection depends on which samples were drawn (leave one shard out).

    The signature and calibration samples were accumulated in ``shards`` disjoint stratified shards;
    the cheap stages and the choice were rerun ``shards`` times, each without one shard.
    ``mean_jaccard`` and ``min_jaccard`` are over every pair of those head sets;
    ``jaccard_to_selection`` is the mean Jaccard of each of them with the run's selection;
    ``k_stars`` and ``heads_kept`` are per rerun; ``kept_frequency[l][h]`` is the share of reruns that
    kept head h of layer l; ``seconds`` what the reruns cost.
    """

    shards: int
    mean_jaccard: float
    min_jaccard: float
    jaccard_to_selection: float
    k_stars: tuple[int, ...]
    heads_kept: tuple[int, ...]
    kept_frequency: tuple[tuple[float, ...], ...]
    seconds: float


@dataclass(frozen=True)
class ConsensusRecord(JsonRecord):
    """How a consensus strategy combined the K + 1 analyses of one selection (the full one and K
    leave-one-shard-out ones) into its choice.

    ``method`` is the strategy (``coassociation``, ``stability-selection``, ``mean-distance``);
    ``runs`` is K + 1; ``k`` the number of clusters every run was cut at (the run's k*).
    ``mean_jaccard`` and ``min_jaccard`` are over every pair of CAHP's K + 1 single-run choices at
    ``k``: how much the runs agreed before the consensus; ``jaccard_to_single_run`` compares the
    consensus with CAHP's choice on the full analysis; ``kept_frequency[l][h]`` is the share of the
    K + 1 single-run choices that kept head h of layer l; ``seconds`` what the consensus cost (no
    sample is read again).
    """

    method: str
    runs: int
    k: int
    mean_jaccard: float
    min_jaccard: float
    jaccard_to_single_run: float
    kept_frequency: tuple[tuple[float, ...], ...]
    seconds: float
