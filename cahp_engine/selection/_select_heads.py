"""Head selection from start to end: the analysis (signatures -> JM features -> graph space -> MSS
sweep -> knee -> salience), then the configured strategy's choice.

References
----------
Paper Algorithm 1, lines 1-11.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from cahp_engine._strategy_names import CONSENSUS_STRATEGIES
from cahp_engine.config import PruningConfig
from cahp_engine.data import TrainRows
from cahp_engine.progress import CancelFn, Monitor, ProgressFn
from cahp_engine.selection._analysis import HeadAnalysis, analyze_heads
from cahp_engine.selection._choice import Selection
from cahp_engine.selection._knee import Knee
from cahp_engine.selection._records import StabilityRecord
from cahp_engine.selection._stability import selection_stability
from cahp_engine.selection._strategies import choose
from cahp_engine.selection._sweep import Clustering


@dataclass(frozen=True)
class SelectionResult:
    """Everything head selection decided, and why: the choice, and the analysis it was made from.

    The curve, its knees, the graph space, the salience and the samples read are the analysis's
    (``result.analysis.curve``...); this record holds what the choice added.

    Attributes
    ----------
    selection : Selection
        The kept heads (``selection.consensus``: for a consensus strategy, how its K + 1 analyses agreed).
    k_star : int
        Number of clusters used: the knee, or ``heads_to_keep``.
    knee : Knee or None
        The knee at ``config.poly_degree`` (None when ``heads_to_keep`` fixed the count).
    analysis : HeadAnalysis
        What the choice was made from; the accuracy budget chooses again from it at other k.
    timings : dict of str to float
        Seconds per stage, the analysis's and the choice's.
    warnings : tuple of str
        The analysis's warnings, and the choice's.
    stability : StabilityRecord or None
        The same choice from the statistics of every shard but one (None when
        ``stability_shards`` is 0 or the shards were too thin).
    """

    selection: Selection
    k_star: int
    knee: Knee | None
    analysis: HeadAnalysis
    timings: dict[str, float] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    stability: StabilityRecord | None = None

    @property
    def clustering(self) -> Clustering | None:
        """The partition at ``k_star`` (None for ``k_star`` = 1, one cluster, and for a count the sweep
        did not reach, as when a speed target keeps every head)."""
        ks = self.analysis.curve.ks
        return self.analysis.partition(self.k_star) if self.k_star in ks else None


def select_heads(
    model: nn.Module,
    train: TrainRows,
    config: PruningConfig,
    *,
    progress: ProgressFn | None = None,
    should_cancel: CancelFn | None = None,
) -> SelectionResult:
    """Run CAHP's selection (or a baseline) on a fine-tuned classifier.

    :func:`~cahp_engine.selection.analyze_heads`, then k* (the knee at ``config.poly_degree``, or
    ``heads_to_keep``), then :func:`~cahp_engine.selection.choose` with ``config.strategy``; the
    baselines keep ``heads_to_keep`` heads, or as many as CAHP keeps at the knee. A consensus strategy
    combines the analysis with its leave-one-shard-out analyses; without them (``stability_shards``
    0, or too few samples per shard) it makes CAHP's choice and says so in ``warnings``.

    Parameters
    ----------
    model : a supported, unpruned sequence classifier, on the device to compute on
    train : EncodedDataset or LazyEncodedDataset
        The training split; signature and calibration samples are drawn from it.
    config : PruningConfig
    progress : callable(stage, fraction), optional
    should_cancel : callable() -> bool, optional
        Polled between batches; True raises :class:`~cahp_engine.errors.JobCancelledError`.

    Returns
    -------
    SelectionResult
        The model's weights and mode are unchanged.

    References
    ----------
    Paper Algorithm 1 lines 1-11; Section IV-B.1-2 for the defaults.
    """
    analysis = analyze_heads(model, train, config, progress=progress, should_cancel=should_cancel)
    n_heads = int(analysis.salience.size)
    knee = None
    if config.heads_to_keep is None:
        knee = analysis.knees[config.poly_degree]
        k_star = knee.k
    else:
        k_star = min(config.heads_to_keep, n_heads - 1)
    monitor = Monitor(progress, should_cancel)
    with monitor.stage("selection"):
        selection = choose(analysis, k_star, config.strategy, count=config.heads_to_keep, seed=config.seed)
    stability = selection_stability(analysis, selection, strategy=config.strategy, poly_degree=config.poly_degree,
                                    heads_to_keep=config.heads_to_keep, seed=config.seed)
    if stability is not None:
        # The leave-one-out choices are part of the stability measure's cost.
        monitor.timings["stability"] = stability.seconds - analysis.timings.get("stability", 0.0)
    warnings = analysis.warnings
    if config.strategy in CONSENSUS_STRATEGIES and selection.consensus is None:
        warnings += (f"no leave-one-shard-out analyses to take the `{config.strategy}` consensus over; "
                     "CAHP's single-run choice was made instead (set `stability_shards` >= 2 and give each "
                     "shard at least two samples per class)",)
    return SelectionResult(
        selection=selection,
        k_star=k_star,
        knee=knee,
        analysis=analysis,
        timings=_merged_timings(analysis.timings, monitor.timings),
        warnings=warnings,
        stability=stability,
    )


def _merged_timings(first: dict[str, float], second: dict[str, float]) -> dict[str, float]:
    out = dict(first)
    for name, seconds in second.items():
        out[name] = out.get(name, 0.0) + seconds
    return out
