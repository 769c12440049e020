"""Head selection from start to end: signatures -> JM features -> graph space -> MSS sweep -> knee
-> salience -> representatives.

References
----------
Paper Algorithm 1, lines 1-11.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from torch import nn

from cahp_engine.adapters import get_adapter, heads_per_layer
from cahp_engine.config import PruningConfig
from cahp_engine.data import EncodedDataset, draw_subset, iterate_batches, length_grouped_batches
from cahp_engine.errors import ConfigError, DatasetError, InvalidInputError
from cahp_engine.graph_space import GraphSpace, default_perplexity, embed_heads
from cahp_engine.knee import Knee, knees_by_degree
from cahp_engine.progress import CancelFn, Monitor, ProgressFn
from cahp_engine.salience import gradient_salience, minmax
from cahp_engine.selection import Selection, select_random, select_representatives, select_top_salience
from cahp_engine.separation import separation_features
from cahp_engine.signatures import default_resolution, extract_signatures
from cahp_engine.sweep import Clustering, MssCurve, mss_sweep

#: The graph space needs a few points: t-SNE needs perplexity < N and the sweep k = 2..N-1 needs
#: at least three values of k for a knee.
MIN_HEADS = 5


@dataclass(frozen=True)
class SelectionResult:
    """Everything head selection decided, and why.

    Attributes
    ----------
    selection : Selection
        The kept heads.
    k_star : int
        Number of clusters used: the knee, or ``heads_to_keep``.
    knee : Knee or None
        The knee at ``config.poly_degree`` (None when ``heads_to_keep`` fixed the count).
    knees : dict of int to Knee
        The knee for each reported degree, from the same curve.
    curve : MssCurve
    clustering : Clustering or None
        The partition at ``k_star`` (None for ``k_star`` = 1: one cluster).
    graph_space : GraphSpace
    salience_raw : ndarray of shape (L, H)
        Mean absolute gate gradient.
    salience : ndarray of shape (L, H)
        ``salience_raw`` min-max normalised to [0, 1].
    resolution : int
    signature_samples, calibration_samples : int
    timings : dict of str to float
        Seconds per stage.
    warnings : tuple of str
    """

    selection: Selection
    k_star: int
    knee: Knee | None
    knees: dict[int, Knee]
    curve: MssCurve
    clustering: Clustering | None
    graph_space: GraphSpace
    salience_raw: np.ndarray
    salience: np.ndarray
    resolution: int
    signature_samples: int
    calibration_samples: int
    timings: dict[str, float] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    @property
    def num_layers(self) -> int:
        return int(self.selection.kept_mask.shape[0])

    @property
    def num_heads(self) -> int:
        return int(self.selection.kept_mask.shape[1])


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
        limit = n_heads - 1 if config.strategy == "cahp" else n_heads
        if k > limit:
            raise ConfigError(f"`heads_to_keep` must be at most {limit} for a model with {n_heads} heads, got {k}")
    if config.perplexity is not None and config.perplexity >= n_heads:
        raise ConfigError(f"`perplexity` must be below the number of heads ({n_heads}), got {config.perplexity}")


def select_heads(
    model: nn.Module,
    train: EncodedDataset,
    config: PruningConfig,
    *,
    progress: ProgressFn | None = None,
    should_cancel: CancelFn | None = None,
) -> SelectionResult:
    """Run CAHP's selection (or a baseline) on a fine-tuned classifier.

    Parameters
    ----------
    model : a supported, unpruned sequence classifier, on the device to compute on
    train : EncodedDataset
        The tokenised training split; signature and calibration samples are drawn from it.
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
    validate_inputs(model, train, config)
    monitor = Monitor(progress, should_cancel)
    device = next(model.parameters()).device
    n = len(train)
    n_layers, n_heads = len(heads_per_layer(model)), heads_per_layer(model)[0]
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
    knee = None
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
        total_k = graph.points.shape[0] - 2
        tick = monitor.counter("sweep", total_k)
        curve = mss_sweep(graph.points, seed=config.seed, on_k=lambda _k: tick(1))
    with monitor.stage("knee"):
        degrees = sorted(set(config.reported_degrees) | {config.poly_degree})
        knees = knees_by_degree(curve.ks, curve.mss, degrees)
        warnings.extend(k.warning for k in knees.values() if k.warning)
        if config.heads_to_keep is None:
            knee = knees[config.poly_degree]
            k_star = knee.k
        else:
            k_star = min(config.heads_to_keep, n_layers * n_heads - 1)
    clustering = curve.at(k_star) if k_star >= 2 else None

    with monitor.stage("salience"):
        cal_batches = length_grouped_batches(train.lengths, cal_idx, config.batch_size, longest_first=True)
        raw = gradient_salience(
            model,
            iterate_batches(train, cal_batches, device),
            on_batch=monitor.counter("salience", len(cal_idx)),
        )
        salience_raw = raw.numpy()
        salience = minmax(raw).numpy()

    with monitor.stage("selection"):
        labels = clustering.labels if clustering is not None else np.zeros(n_layers * n_heads, dtype=np.int64)
        cahp = select_representatives(labels, salience)
        count = config.heads_to_keep or cahp.num_kept
        selection: Selection
        if config.strategy == "cahp":
            selection = cahp
        elif config.strategy == "salience":
            selection = select_top_salience(salience, count)
        else:
            selection = select_random((n_layers, n_heads), count, seed=config.seed)

    return SelectionResult(
        selection=selection,
        k_star=k_star,
        knee=knee,
        knees=knees,
        curve=curve,
        clustering=clustering,
        graph_space=graph,
        salience_raw=salience_raw,
        salience=salience,
        resolution=resolution,
        signature_samples=len(sig_idx),
        calibration_samples=len(cal_idx),
        timings=dict(monitor.timings),
        warnings=tuple(warnings),
    )


