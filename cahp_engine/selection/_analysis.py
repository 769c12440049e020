"""What head selection knows about a model before choosing: signatures -> JM features -> graph space
-> MSS sweep -> knees, and the importance of every head.

:func:`analyze_heads` computes it once; :func:`cahp_engine.selection.choose` then turns it into the
heads to keep for any strategy and cluster count, at no further cost.

References
----------
Paper Algorithm 1, lines 1-9; Section III-D, Eq. 6 for the importance.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from cahp_engine._strategy_names import CONSENSUS_STRATEGIES
from cahp_engine.config import PruningConfig
from cahp_engine.data import LazyEncodedDataset, TrainRows, row_lengths
from cahp_engine.errors import ConfigError, DatasetError, InvalidInputError
from cahp_engine.models import get_adapter, heads_per_layer
from cahp_engine.progress import CancelFn, Monitor, ProgressFn
from cahp_engine.selection._convergence import (
    CALIBRATION_CLASS_FLOOR,
    CALIBRATION_FIRST,
    SIGNATURE_CLASS_FLOOR,
    SIGNATURE_FIRST,
    plan,
    run_calibration,
    run_signatures,
)
from cahp_engine.selection._graph_space import GraphSpace
from cahp_engine.selection._head_structure import HeadStructure, head_structure
from cahp_engine.selection._knee import Knee
from cahp_engine.selection._records import SamplingRecord
from cahp_engine.selection._salience import HeadImportance, gradient_salience, minmax
from cahp_engine.selection._sampling import SampleOrder, resolve_amount, stratified_order
from cahp_engine.selection._signatures import Signatures, default_resolution
from cahp_engine.selection._sweep import Clustering, MssCurve

#: The graph space needs a few points: t-SNE needs perplexity < N and the sweep k = 2..N-1 needs
#: at least three values of k for a knee.
MIN_HEADS = 5
#: A split tokenised on demand takes B from the lengths of this many rows (a seeded random sample).
LENGTH_SAMPLE = 10_000


@dataclass(frozen=True)
class HeadAnalysis:
    """The MSS curve, its knees and the head importance of one model, ready for any strategy.

    Attributes
    ----------
    curve : MssCurve
        FasterPAM partition and MSS for k = 2..N-1, N = L * H heads.
    knees : dict of int to Knee
        The knee of each polynomial degree in ``config.reported_degrees`` and ``config.poly_degree``.
    graph_space : GraphSpace
        t-SNE coordinates, row ``l * H + h``.
    salience_raw : ndarray of shape (L, H)
        The importance function's scores (mean absolute gate gradient by default).
    salience : ndarray of shape (L, H)
        ``salience_raw`` min-max normalised to [0, 1].
    resolution : int
        Side B of the resized attention maps.
    signature_samples, calibration_samples : int
        Training samples profiled for the signatures and averaged over for the importance.
    timings : dict of str to float
        Seconds per stage (``stability``: the leave-one-shard-out reruns of the cheap stages).
    warnings : tuple of str
    signature_sampling, calibration_sampling : SamplingRecord or None
        How many samples each pass read and why it stopped (None for the leave-one-out analyses).
    leave_one_out : tuple of HeadAnalysis
        One analysis per shard, from the statistics of every other shard (empty when
        ``stability_shards`` is 0 or the shards are too thin).
    """

    curve: MssCurve
    knees: dict[int, Knee]
    graph_space: GraphSpace
    salience_raw: np.ndarray
    salience: np.ndarray
    resolution: int
    signature_samples: int
    calibration_samples: int
    timings: dict[str, float] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    signature_sampling: SamplingRecord | None = None
    calibration_sampling: SamplingRecord | None = None
    leave_one_out: tuple[HeadAnalysis, ...] = ()

    @property
    def shape(self) -> tuple[int, int]:
        """(L, H): layers and heads per layer."""
        return int(self.salience.shape[0]), int(self.salience.shape[1])

    def partition(self, k: int) -> Clustering | None:
        """The partition into ``k`` clusters, None for ``k`` = 1 (one cluster of every head)."""
        return self.curve.at(k) if k >= 2 else None

    def labels(self, k: int) -> np.ndarray:
        """Cluster id of head ``l * H + h`` for ``k`` clusters, shape (N,)."""
        clustering = self.partition(k)
        return clustering.labels if clustering is not None else np.zeros(self.salience.size, dtype=np.int64)


def validate_inputs(model: nn.Module, train: TrainRows, config: PruningConfig) -> None:
    """Reject what cannot work before any long computation starts."""
    adapter = get_adapter(model)
    heads = heads_per_layer(model)
    if len(set(heads)) != 1 or heads[0] != adapter.num_heads(model.config):
        raise InvalidInputError("this model is already pruned; give CAHP the dense fine-tuned model")
    n_heads = sum(heads)
    if n_heads < MIN_HEADS:
        raise InvalidInputError(
            f"the model has {n_heads} attention heads; the graph space needs at least {MIN_HEADS}"
        )
    if len(train) == 0:
        raise DatasetError("the training split has no rows; give at least two labelled samples per class")
    if train.num_classes < 2:
        raise DatasetError(f"CAHP needs at least two classes; the training split has {train.num_classes}")
    present = np.bincount(train.labels, minlength=train.num_classes)
    missing = np.flatnonzero(present == 0).tolist()
    if missing:
        raise DatasetError(f"classes {missing} have no samples in the training split; every class needs some")
    k = config.heads_to_keep
    if k is not None:
        # CAHP (and a consensus of CAHP's analyses) keeps one head per cluster and the sweep stops at
        # N - 1 clusters.
        limit = n_heads - 1 if config.strategy in ("cahp", *CONSENSUS_STRATEGIES) else n_heads
        if k > limit:
            raise ConfigError(f"`heads_to_keep` must be at most {limit} for a model with {n_heads} heads, got {k}")
    if config.perplexity is not None and config.perplexity >= n_heads:
        raise ConfigError(f"`perplexity` must be below the number of heads ({n_heads}), got {config.perplexity}")


def analyze_heads(
    model: nn.Module,
    train: TrainRows,
    config: PruningConfig,
    *,
    progress: ProgressFn | None = None,
    should_cancel: CancelFn | None = None,
    importance: HeadImportance = gradient_salience,
    plateau_gain: float | None = None,
) -> HeadAnalysis:
    """Profile, embed and cluster the heads of a fine-tuned classifier, and score their importance.

    Parameters
    ----------
    model : a supported, unpruned sequence classifier, on the device to compute on
    train : EncodedDataset or LazyEncodedDataset
        The training split; signature and calibration samples are read from it in seeded stratified
        orders (a lazy split is tokenised only where it is read).
    config : PruningConfig
        ``signature_samples``, ``calibration_fraction``, ``resolution``, ``var_floor``,
        ``perplexity``, ``poly_degree``, ``reported_degrees``, ``heads_to_keep``,
        ``stability_shards``, ``batch_size`` and ``seed`` apply.
    progress : callable(stage, fraction), optional
        Stages ``signatures``, ``separation``, ``graph_space``, ``sweep``, ``knee``, ``salience``,
        ``stability``.
    should_cancel : callable() -> bool, optional
        Polled between batches; True raises :class:`~cahp_engine.errors.JobCancelledError`.
    importance : HeadImportance
        ``(model, batches) -> Tensor of shape (L, H)``, higher = more important; it is called on one
        calibration batch at a time and the scores are averaged over the batches (the stopping rule
        needs their spread). Default: CAHP's gradient salience.
    plateau_gain : float or None
        With ``"auto"`` amounts, a pass also stops once its noise share, at most 0.8 two rungs
        ago, fell by less than this share of itself since (:func:`~cahp_engine.selection.is_plateau`;
        :data:`~cahp_engine.selection.PLATEAU_GAIN` is the measured rule). None (the default) leaves
        the rule off: on all-MiniLM-L6-v2 with a new head and SST-5 it cut the selection from 70 to
        42 s but lowered the run-to-run Jaccard of CAHP's heads from 0.45 to 0.37 at degree 2
        (docs/performance.md, "Run-to-run agreement").

    Returns
    -------
    HeadAnalysis
        The model's weights and mode are unchanged.

    Notes
    -----
    With ``"auto"`` amounts each pass stops once what it measures is mostly signal, or has stopped
    becoming more so (:mod:`cahp_engine.selection._convergence`). Both accumulate in
    ``stability_shards`` shards; the cheap stages are rerun once per left-out shard
    (``leave_one_out``), which reads no sample again.

    References
    ----------
    Paper Algorithm 1 lines 1-9; Section IV-B.1-2 for the defaults.
    """
    validate_inputs(model, train, config)
    monitor = Monitor(progress, should_cancel)
    device = next(model.parameters()).device
    n = len(train)
    heads = heads_per_layer(model)
    shape = (len(heads), heads[0])
    warnings: list[str] = []
    shards = config.stability_shards or 1
    degrees = sorted(set(config.reported_degrees) | {config.poly_degree})

    sig_order = stratified_order(train.labels, seed=config.seed, shards=shards)
    cal_order = stratified_order(train.labels, seed=config.seed + 1, shards=shards)
    sig_amount = resolve_amount(config.signature_samples, n)
    cal_amount = resolve_amount(config.calibration_fraction, n)
    if sig_amount is not None:
        per_class = np.bincount(train.labels[sig_order.rows[:sig_amount]], minlength=train.num_classes)
        thin = np.flatnonzero(per_class < 2).tolist()
        if thin:
            raise DatasetError(
                f"classes {thin} have fewer than two of the {sig_amount} signature samples, so their "
                "variance is undefined; raise `signature_samples` or add samples of those classes"
            )
    sig_sizes = plan(sig_order, train.labels, sig_amount, floor=SIGNATURE_CLASS_FLOOR, first=SIGNATURE_FIRST)
    cal_sizes = plan(cal_order, train.labels, cal_amount, floor=CALIBRATION_CLASS_FLOOR, first=CALIBRATION_FIRST)
    resolution = config.resolution or _default_resolution(train, sig_order)

    def structure(signatures: Signatures, *, timed: bool = False) -> HeadStructure:
        return head_structure(signatures, var_floor=config.var_floor, perplexity=config.perplexity,
                              seed=config.seed, degrees=degrees, monitor=monitor if timed else None)

    with monitor.stage("signatures"):
        sharded, sig_record = run_signatures(
            model, train, sig_order, sig_sizes, auto=sig_amount is None, resolution=resolution,
            var_floor=config.var_floor, batch_size=config.batch_size, device=device, monitor=monitor,
            plateau_gain=plateau_gain,
        )
    main = structure(sharded.merged(), timed=True)
    warnings.extend(k.warning for k in main.knees.values() if k.warning)
    with monitor.stage("salience"):
        calibration = run_calibration(
            model, train, cal_order, cal_sizes, auto=cal_amount is None, importance=importance, shape=shape,
            batch_size=config.batch_size, seed=config.seed + 2, device=device, monitor=monitor,
            plateau_gain=plateau_gain,
        )
    salience_raw = calibration.raw()

    leave_one_out: tuple[HeadAnalysis, ...] = ()
    if shards >= 2:
        with monitor.stage("stability"):
            per_class = sharded.counts.sum(axis=0)
            if (per_class - sharded.counts.max(axis=0) >= 2).all():
                leave_one_out = tuple(
                    _analysis(structure(sharded.merged(leave_out=k)), calibration.raw(leave_out=k), resolution,
                              sharded.samples - int(sharded.counts[k].sum()), calibration.samples)
                    for k in range(shards)
                )
            else:
                warnings.append(
                    f"too few signature samples per class to leave one of {shards} shards out; "
                    "no stability measure (raise `signature_samples` or lower `stability_shards`)"
                )

    base = _analysis(main, salience_raw, resolution, sharded.samples, calibration.samples)
    return dataclasses.replace(
        base,
        signature_sampling=sig_record,
        calibration_sampling=calibration.record,
        leave_one_out=leave_one_out,
        timings=dict(monitor.timings),
        warnings=tuple(warnings),
    )


def _analysis(structure: HeadStructure, salience_raw: np.ndarray, resolution: int, signature_samples: int,
              calibration_samples: int) -> HeadAnalysis:
    return HeadAnalysis(
        curve=structure.curve,
        knees=structure.knees,
        graph_space=structure.graph_space,
        salience_raw=salience_raw,
        salience=_minmax(salience_raw),
        resolution=resolution,
        signature_samples=signature_samples,
        calibration_samples=calibration_samples,
    )


def _minmax(scores: np.ndarray) -> np.ndarray:
    return minmax(torch.as_tensor(scores, dtype=torch.float64)).numpy()


def _default_resolution(train: TrainRows, order: SampleOrder) -> int:
    """The paper's B from every row's length, or, for a split tokenised on demand, from the first
    :data:`LENGTH_SAMPLE` rows of the stratified order (a seeded random sample)."""
    if isinstance(train, LazyEncodedDataset):
        return default_resolution(row_lengths(train, order.rows[:LENGTH_SAMPLE]))
    return default_resolution(train.lengths)
