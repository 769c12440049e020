"""Attention signatures: per-class mean and variance of every head's resized attention map.

References
----------
Paper Section III-B (padding-aware interpolation) and Section IV-B.1 (B = 70th percentile of the
tokenised lengths; Welford streaming statistics).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from cahp_engine.errors import DatasetError, PipelineError
from cahp_engine.models import eager_attention, get_adapter


@dataclass(frozen=True)
class Signatures:
    """Class-conditional statistics of the resized attention maps of every head.

    Attributes
    ----------
    mean, var : ndarray of shape (C, N, B * B), float64
        Per class ``c``, head ``n = l * H + h`` and pixel: mean and population variance (ddof=0).
    counts : ndarray of shape (C,), int64
        Samples seen per class.
    resolution : int
        Side B of the resized maps.
    num_layers, num_heads : int
        L and H; N = L * H.
    """

    mean: np.ndarray
    var: np.ndarray
    counts: np.ndarray
    resolution: int
    num_layers: int
    num_heads: int

    @property
    def num_classes(self) -> int:
        return int(self.counts.shape[0])


class ClassMoments:
    """Streaming per-group mean and sum of squared deviations, in float64.

    Parameters
    ----------
    num_classes : int
        G, the number of groups (classes, or shard x class).
    num_features : int
    device : torch device of the accumulators

    Notes
    -----
    Each group keeps shifted sums ``S1 = sum(x - c)`` and ``S2 = sum((x - c)^2)`` around a shift c,
    the first value it received; then ``mean = c + S1 / n`` and ``M2 = S2 - S1^2 / n``. A batch
    costs two scatter-adds over its own samples and no pass over every group's accumulators, so
    many groups (K shards x C classes) cost no more time than C. Because c lies within the group's
    values, ``S2`` and ``S1^2 / n`` are of the order of ``M2`` and the subtraction loses nothing
    in float64 (the shifted-data algorithm, Chan, Golub and LeVeque 1983). Memory is O(G * F)
    whatever the number of samples. Groups are merged with :func:`merge_moments`.
    """

    def __init__(self, num_classes: int, num_features: int, device: torch.device | str = "cpu") -> None:
        self.num_classes = num_classes
        self.count = torch.zeros(num_classes, dtype=torch.float64, device=device)
        self._shift = torch.zeros(num_classes, num_features, dtype=torch.float64, device=device)
        self._sum = torch.zeros(num_classes, num_features, dtype=torch.float64, device=device)
        self._squares = torch.zeros(num_classes, num_features, dtype=torch.float64, device=device)

    def update(self, values: torch.Tensor, labels: torch.Tensor) -> None:
        """Merge a batch.

        Parameters
        ----------
        values : Tensor of shape (n, F)
        labels : Tensor of shape (n,), integers in 0..G-1
        """
        x = values.to(torch.float64)
        labels = labels.to(x.device)
        n_b = torch.bincount(labels, minlength=self.num_classes).to(torch.float64)
        new = (n_b > 0) & (self.count == 0)
        if bool(new.any()):
            # The shift of a group seen for the first time: its first sample in this batch.
            first = torch.full((self.num_classes,), labels.numel(), dtype=torch.long, device=x.device)
            first.scatter_reduce_(0, labels, torch.arange(labels.numel(), device=x.device), reduce="amin")
            groups = torch.nonzero(new, as_tuple=True)[0]
            self._shift[groups] = x[first[groups]]
        centred = x - self._shift[labels]
        self._sum.index_add_(0, labels, centred)
        self._squares.index_add_(0, labels, centred * centred)
        self.count += n_b

    @property
    def mean(self) -> torch.Tensor:
        """Per-group mean, shape (G, F); 0 for an empty group."""
        return self._shift + self._sum / self.count.clamp(min=1.0).unsqueeze(1)

    @property
    def m2(self) -> torch.Tensor:
        """Per-group sum of squared deviations from the mean, shape (G, F)."""
        m2 = self._squares - self._sum * self._sum / self.count.clamp(min=1.0).unsqueeze(1)
        return m2.clamp(min=0.0)

    def finalize(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Return ``(mean, var, counts)`` as numpy arrays; variance with ddof=0."""
        var = self.m2 / self.count.clamp(min=1.0).unsqueeze(1)
        return self.mean.cpu().numpy(), var.cpu().numpy(), self.count.cpu().numpy().astype(np.int64)


class _AllLayersCaptured(Exception):
    """Raised from the last layer's hook to end a forward pass whose remaining work is not needed."""


def crop_and_resize(attn: torch.Tensor, mask: torch.Tensor, resolution: int) -> torch.Tensor:
    """Crop each sample's attention maps to its real tokens and resize them to B x B.

    Parameters
    ----------
    attn : Tensor of shape (n, H, T, T)
        Attention probabilities of one layer.
    mask : Tensor of shape (n, T)
        1 on real tokens, 0 on padding; padding may sit on either side.
    resolution : int
        B.

    Returns
    -------
    Tensor of shape (n, H, B * B), float32

    Notes
    -----
    Samples are grouped by real length, so the work is one gather and one bilinear interpolation
    (``align_corners=False``) per distinct length in the batch, not per sample or per head.
    """
    n, h, t, _ = attn.shape
    out = attn.new_empty((n, h, resolution * resolution), dtype=torch.float32)
    lengths = mask.sum(dim=1)
    for length in torch.unique(lengths).tolist():
        rows = torch.nonzero(lengths == length, as_tuple=True)[0]
        group = attn.index_select(0, rows)
        if length != t:
            # Real-token positions of each row, in order: works for left, right or mixed padding.
            pos = torch.nonzero(mask.index_select(0, rows), as_tuple=True)[1].view(len(rows), 1, length)
            group = torch.gather(group, 2, pos.unsqueeze(-1).expand(-1, h, -1, t))
            group = torch.gather(group, 3, pos.unsqueeze(-2).expand(-1, h, length, -1))
        resized = F.interpolate(group.float(), size=(resolution, resolution), mode="bilinear", align_corners=False)
        out[rows] = resized.reshape(len(rows), h, -1)
    return out


class SignatureProfiler:
    """Profiles heads batch by batch into per-shard, per-class statistics, read at any batch (each rung of a ladder).

    Parameters
    ----------
    model : a supported sequence classifier (on the device the batches are on)
    num_classes : int
        C; labels must be in 0..C-1.
    resolution : int
        B, the side of the resized maps.
    shards : int, default 1
        K: every sample is merged into the statistics of the shard the caller names, so that the
        statistics of any union of shards follow exactly (:meth:`ShardedSignatures.merged`).

    Notes
    -----
    Use as a context manager: on entry the model is put in ``eval()`` mode with the eager attention
    implementation (the only one that returns probabilities in transformers 5) and a forward hook on
    each layer's self-attention module; on exit the previous mode and implementation are restored.
    The hook reduces that layer's (n, H, T, T) maps to (n, H, B * B) and merges them into that
    layer's running statistics at once, so the maps of different layers are never held together,
    and the pass stops right after the last layer's attention. Shard k of class c is group
    ``k * C + c`` of one :class:`ClassMoments` per layer, so K shards cost K times the memory of one
    and no extra time per batch (a batch touches only the accumulators of its own samples).

    References
    ----------
    Paper Section III-B; Chan, Golub and LeVeque (1979) for the merge.
    """

    def __init__(self, model: nn.Module, *, num_classes: int, resolution: int, shards: int = 1) -> None:
        adapter = get_adapter(model)
        self.model = model
        self.num_classes = num_classes
        self.resolution = resolution
        self.shards = shards
        self._adapter = adapter
        self._layers = adapter.layers(model)
        self.num_layers, self.num_heads = len(self._layers), adapter.num_heads(model.config)
        device = next(model.parameters()).device
        # One accumulator per layer, updated inside that layer's hook: the per-batch temporaries stay
        # layer-sized (cache-friendly) instead of covering all N heads at once.
        self._moments = [
            ClassMoments(shards * num_classes, self.num_heads * resolution * resolution, device=device)
            for _ in self._layers
        ]
        self._current: dict[str, torch.Tensor] = {}
        self._captured = [False] * self.num_layers
        self._stack: contextlib.ExitStack | None = None
        self.samples = 0

    def _hook(self, index: int) -> Callable[..., None]:
        def hook(_module: nn.Module, _args: object, output: object) -> None:
            weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
            if weights is None:
                raise PipelineError(
                    "the attention module returned no attention probabilities; the eager attention "
                    "implementation is required and could not be enabled for this model"
                )
            resized = crop_and_resize(weights, self._current["mask"], self.resolution)
            self._moments[index].update(resized.reshape(resized.shape[0], -1), self._current["groups"])
            self._captured[index] = True
            if index == self.num_layers - 1:
                # Nothing after the last attention block (its feed-forward, the pooler, the
                # classifier) changes a signature: stop the pass here instead of computing them.
                raise _AllLayersCaptured

        return hook

    def __enter__(self) -> SignatureProfiler:
        stack = contextlib.ExitStack()
        was_training = self.model.training
        stack.callback(self.model.train, was_training)
        self.model.eval()
        for i, layer in enumerate(self._layers):
            handle = self._adapter.attention(layer).module.register_forward_hook(self._hook(i))
            stack.callback(handle.remove)
        stack.enter_context(eager_attention(self.model))
        stack.enter_context(torch.no_grad())
        self._stack = stack
        return self

    def __exit__(self, *exc: object) -> None:
        if self._stack is not None:
            self._stack.close()
            self._stack = None

    def update(self, batch: dict[str, torch.Tensor], shard: torch.Tensor | int = 0) -> None:
        """Profile one batch.

        Parameters
        ----------
        batch : dict with ``input_ids``, ``attention_mask`` (n, T), ``labels`` (n,) and optionally
            ``token_type_ids``
        shard : int or Tensor of shape (n,)
            The shard (0..K-1) of every sample, or one shard for the whole batch.
        """
        if self._stack is None:
            raise RuntimeError("use SignatureProfiler as a context manager")
        labels = batch["labels"]
        c = self.num_classes
        if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= c):
            raise DatasetError(f"labels must be integers in 0..{c - 1}")
        shard_ids = torch.as_tensor(shard, device=labels.device).to(labels.dtype).expand_as(labels)
        self._current["mask"] = batch["attention_mask"]
        self._current["groups"] = shard_ids * c + labels
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        try:
            self.model(**inputs)
        except _AllLayersCaptured:
            pass
        if not all(self._captured):
            raise PipelineError("an attention layer did not run; cannot build its signature")
        self._captured[:] = [False] * self.num_layers
        self.samples += int(labels.numel())

    def snapshot(self) -> ShardedSignatures:
        """The statistics so far, per shard (a copy: profiling can go on)."""
        k, c, b2 = self.shards, self.num_classes, self.resolution * self.resolution
        counts = self._moments[0].count.cpu().numpy().astype(np.int64).reshape(k, c)
        shape = (k, c, self.num_layers * self.num_heads, b2)
        # (K*C, H*B2) per layer -> (K, C, L*H, B2), heads in global order n = l * H + h.
        mean = np.concatenate([m.mean.cpu().numpy().reshape(k, c, self.num_heads, b2) for m in self._moments],
                              axis=2).reshape(shape)
        m2 = np.concatenate([m.m2.cpu().numpy().reshape(k, c, self.num_heads, b2) for m in self._moments],
                            axis=2).reshape(shape)
        return ShardedSignatures(counts=counts, mean=mean, m2=m2, resolution=self.resolution,
                                 num_layers=self.num_layers, num_heads=self.num_heads)


def merge_moments(counts: np.ndarray, means: np.ndarray, m2s: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge per-part statistics into those of the union (Chan et al.'s parallel form).

    Parameters
    ----------
    counts : ndarray of shape (S, C)
        Samples of each part (shard) and group (class).
    means, m2s : ndarray of shape (S, C, ...)
        Mean and sum of squared deviations of each part and group.

    Returns
    -------
    counts : ndarray of shape (C,)
    mean, m2 : ndarray of shape (C, ...)
        Exactly the statistics of the pooled samples (up to rounding): merging is associative.
    """
    n = counts[0].astype(np.float64)
    mean = means[0].astype(np.float64, copy=True)
    m2 = m2s[0].astype(np.float64, copy=True)
    extra = (1,) * (mean.ndim - 1)
    for part in range(1, counts.shape[0]):
        n_b = counts[part].astype(np.float64)
        total = n + n_b
        safe = np.maximum(total, 1.0).reshape(-1, *extra)
        delta = means[part] - mean
        mean += delta * (n_b.reshape(-1, *extra) / safe)
        m2 += m2s[part] + delta * delta * ((n * n_b).reshape(-1, *extra) / safe)
        n = total
    return n.astype(np.int64), mean, m2


@dataclass(frozen=True)
class ShardedSignatures:
    """Signature statistics kept per shard, so that any union of shards is exact and cheap.

    Attributes
    ----------
    counts : ndarray of shape (K, C), int64
    mean, m2 : ndarray of shape (K, C, N, B * B), float64
        Per shard, class, head and pixel: mean and sum of squared deviations.
    resolution, num_layers, num_heads : int
    """

    counts: np.ndarray
    mean: np.ndarray
    m2: np.ndarray
    resolution: int
    num_layers: int
    num_heads: int

    @property
    def num_shards(self) -> int:
        return int(self.counts.shape[0])

    @property
    def samples(self) -> int:
        return int(self.counts.sum())

    def merged(self, leave_out: int | None = None) -> Signatures:
        """The statistics of every shard but ``leave_out`` (all shards when None)."""
        keep = [k for k in range(self.num_shards) if k != leave_out]
        counts, mean, m2 = merge_moments(self.counts[keep], self.mean[keep], self.m2[keep])
        var = m2 / np.maximum(counts, 1).reshape(-1, 1, 1)
        return Signatures(mean=mean, var=var, counts=counts, resolution=self.resolution,
                          num_layers=self.num_layers, num_heads=self.num_heads)


def extract_signatures(
    model: nn.Module,
    batches: Iterable[dict[str, torch.Tensor]],
    *,
    num_classes: int,
    resolution: int,
    on_batch: Callable[[int], None] | None = None,
) -> Signatures:
    """Profile every head over ``batches`` and return its class-conditional statistics.

    Parameters
    ----------
    model : a supported sequence classifier (on the device the batches are on)
    batches : iterable of dicts with ``input_ids``, ``attention_mask`` (n, T), ``labels`` (n,) and
        optionally ``token_type_ids``
    num_classes : int
        C; labels must be in 0..C-1.
    resolution : int
        B, the side of the resized maps.
    on_batch : callable, optional
        Called with the number of samples of each finished batch (progress, cancellation).

    Returns
    -------
    Signatures

    Notes
    -----
    One pass of a :class:`SignatureProfiler` with one shard; the model's mode and attention
    implementation are restored afterwards.

    References
    ----------
    Paper Section III-B.
    """
    with SignatureProfiler(model, num_classes=num_classes, resolution=resolution) as profiler:
        for batch in batches:
            profiler.update(batch)
            if on_batch is not None:
                on_batch(int(batch["labels"].numel()))
    return profiler.snapshot().merged()


def default_resolution(lengths: np.ndarray, *, percentile: float = 70.0) -> int:
    """The paper's rule for B: the 70th percentile of the tokenised training lengths (at least 2).

    References
    ----------
    Paper Section IV-B.1.
    """
    if len(lengths) == 0:
        raise DatasetError("cannot choose a resolution from an empty training split")
    return max(2, int(round(float(np.percentile(lengths, percentile)))))
