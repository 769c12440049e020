"""What head selection knows about a model before choosing: signatures -> JM features -> graph space
-> MSS sweep -> knees, and the importance of every head.

:func:`analyze_heads` computes it once; :func:`cahp_engine.strategies.choose` then turns it into the
heads to keep for any strategy and cluster count, at no further cost.

References
----------
Paper Algorithm 1, lines 1-9; Section III-D, Eq. 6 for the importance.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from cahp_engine.adapters import get_adapter, heads_per_layer
from cahp_engine.config import PruningConfig
from cahp_engine.data import EncodedDataset, draw_subset, iterate_batches, length_grouped_batches
from cahp_engine.errors import ConfigError, DatasetError, InvalidInputError, PipelineError
from cahp_engine.graph_space import GraphSpace, default_perplexity, embed_heads
from cahp_engine.knee import Knee, knees_by_degree
from cahp_engine.progress import CancelFn, Monitor, ProgressFn
from cahp_engine.salience import HeadImportance, gradient_salience, minmax
from cahp_engine.separation import separation_features
from cahp_engine.signatures import default_resolution, extract_signatures
from cahp_engine.sweep import Clustering, MssCurve, mss_sweep

#: The graph space needs a few points: t-SNE needs perplexity < N and the sweep k = 2..N-1 needs
#: at least three values of k for a knee.
MIN_HEADS = 5


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
        Seconds per stage.
    warnings : tuple of str
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


def validate_inputs(model: nn.Module, train: EncodedDataset, config: PruningConfig) -> None:
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
        # CAHP keeps one head per cluster and the sweep stops at N - 1 clusters.
        limit = n_heads - 1 if config.strategy == "cahp" else n_heads
        if k > limit:
            raise ConfigError(f"`heads_to_keep` must be at most {limit} for a model with {n_heads} heads, got {k}")
    if config.perplexity is not None and config.perplexity >= n_heads:
        raise ConfigError(f"`perplexity` must be below the number of heads ({n_heads}), got {config.perplexity}")


def analyze_heads(
    model: nn.Module,
    train: EncodedDataset,
    config: PruningConfig,
    *,
    progress: ProgressFn | None = None,
    should_cancel: CancelFn | None = None,
    importance: HeadImportance = gradient_salience,
) -> HeadAnalysis:
    """Profile, embed and cluster the heads of a fine-tuned classifier, and score their importance.

    Parameters
    ----------
    model : a supported, unpruned sequence classifier, on the device to compute on
    train : EncodedDataset
        The tokenised training split; signature and calibration samples are drawn from it with
        ``config.seed``.
    config : PruningConfig
        ``signature_samples``, ``calibration_fraction``, ``resolution``, ``var_floor``,
        ``perplexity``, ``poly_degree``, ``reported_degrees``, ``batch_size`` and ``seed`` apply.
    progress : callable(stage, fraction), optional
        Stages ``signatures``, ``separation``, ``graph_space``, ``sweep``, ``knee``, ``salience``.
    should_cancel : callable() -> bool, optional
        Polled between batches; True raises :class:`~cahp_engine.errors.JobCancelledError`.
    importance : HeadImportance
        ``(model, batches) -> Tensor of shape (L, H)``, higher = more important, over the
        calibration batches. Default: CAHP's gradient salience.

    Returns
    -------
    HeadAnalysis
        The model's weights and mode are unchanged.

    References
    ----------
    Paper Algorithm 1 lines 1-9; Section IV-B.1-2 for the defaults.
    """
    validate_inputs(model, train, config)
    monitor = Monitor(progress, should_cancel)
    device = next(model.parameters()).device
    n = len(train)
    warnings: list[str] = []

    sig_idx = draw_subset(n, config.signature_samples, seed=config.seed, labels=train.labels)
    cal_idx = draw_subset(n, config.calibration_fraction, seed=config.seed + 1, labels=train.labels)
    per_class = np.bincount(train.labels[sig_idx], minlength=train.num_classes)
    thin = np.flatnonzero(per_class < 2).tolist()
    if thin:
        raise DatasetError(
            f"classes {thin} have fewer than two of the {len(sig_idx)} signature samples, so their "
            "variance is undefined; raise `signature_samples` or add samples of those classes"
        )
    resolution = config.resolution or default_resolution(train.lengths)
    # The graph space and the MSS curve are computed for the baselines too: they cost little next to
    # fine-tuning, and the artifacts (curve, head map) then mean the same thing for every strategy.
    with monitor.stage("signatures"):
        batches = length_grouped_batches(train.lengths, sig_idx, config.batch_size, longest_first=True)
        signatures = extract_signatures(
            model,
            iterate_batches(train, batches, device),
            num_classes=train.num_classes,
            resolution=resolution,
            on_batch=monitor.counter("signatures", len(sig_idx)),
        )
    with monitor.stage("separation"):
        features = separation_features(signatures, var_floor=config.var_floor)
    with monitor.stage("graph_space"):
        perplexity = config.perplexity or default_perplexity(features.matrix.shape[0])
        graph = embed_heads(features.matrix, seed=config.seed, perplexity=perplexity)
    with monitor.stage("sweep"):
        tick = monitor.counter("sweep", graph.points.shape[0] - 2)
        curve = mss_sweep(graph.points, seed=config.seed, on_k=lambda _k: tick(1))
    with monitor.stage("knee"):
        degrees = sorted(set(config.reported_degrees) | {config.poly_degree})
        knees = knees_by_degree(curve.ks, curve.mss, degrees)
        warnings.extend(k.warning for k in knees.values() if k.warning)
    with monitor.stage("salience"):
        cal_batches = length_grouped_batches(train.lengths, cal_idx, config.batch_size, longest_first=True)
        counted = _counted(iterate_batches(train, cal_batches, device), monitor.counter("salience", len(cal_idx)))
        raw = importance(model, counted)
        if tuple(raw.shape) != (len(heads_per_layer(model)), heads_per_layer(model)[0]):
            raise PipelineError(f"the head importance has shape {tuple(raw.shape)}; one score per head was expected")
        raw = raw.detach().to("cpu", torch.float64)

    return HeadAnalysis(
        curve=curve,
        knees=knees,
        graph_space=graph,
        salience_raw=raw.numpy(),
        salience=minmax(raw).numpy(),
        resolution=resolution,
        signature_samples=len(sig_idx),
        calibration_samples=len(cal_idx),
        timings=dict(monitor.timings),
        warnings=tuple(warnings),
    )


def _counted(
    batches: Iterable[dict[str, torch.Tensor]], on_batch: Callable[[int], None]
) -> Iterator[dict[str, torch.Tensor]]:
    """Yield ``batches``, reporting each one's sample count when the consumer asks for the next."""
    for batch in batches:
        yield batch
        on_batch(int(batch["labels"].numel()))
