"""Attention signatures: per-class mean and variance of every head's resized attention map.

References
----------
Paper Section III-B (padding-aware interpolation) and Section IV-B.1 (B = 70th percentile of the
tokenised lengths; Welford streaming statistics).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from cahp_engine.adapters import eager_attention, get_adapter
from cahp_engine.errors import DatasetError, PipelineError


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
    """Streaming per-class mean and sum of squared deviations (Chan et al.'s parallel merge).

    Parameters
    ----------
    num_classes : int
    num_features : int
    device : torch device of the accumulators (float64)

    Notes
    -----
    A batch's per-class mean and M2 are computed exactly, then merged into the running totals; memory
    is O(C * F) whatever the number of samples.
    """

    def __init__(self, num_classes: int, num_features: int, device: torch.device | str = "cpu") -> None:
        self.num_classes = num_classes
        self.count = torch.zeros(num_classes, dtype=torch.float64, device=device)
        self.mean = torch.zeros(num_classes, num_features, dtype=torch.float64, device=device)
        self.m2 = torch.zeros(num_classes, num_features, dtype=torch.float64, device=device)

    def update(self, values: torch.Tensor, labels: torch.Tensor) -> None:
        """Merge a batch.

        Parameters
        ----------
        values : Tensor of shape (n, F)
        labels : Tensor of shape (n,), integers in 0..C-1
        """
        x = values.to(torch.float64)
        labels = labels.to(x.device)
        n_b = torch.bincount(labels, minlength=self.num_classes).to(torch.float64)
        sums = torch.zeros_like(self.mean).index_add_(0, labels, x)
        mean_b = sums / n_b.clamp(min=1.0).unsqueeze(1)
        dev = x - mean_b[labels]
        m2_b = torch.zeros_like(self.m2).index_add_(0, labels, dev * dev)
        n_a = self.count
        n = n_a + n_b
        safe_n = n.clamp(min=1.0).unsqueeze(1)
        delta = mean_b - self.mean
        self.mean += delta * (n_b.unsqueeze(1) / safe_n)
        self.m2 += m2_b + delta * delta * (n_a * n_b).unsqueeze(1) / safe_n
        self.count = n

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
    Maps are captured in ``eval()`` mode under ``no_grad`` with the eager attention implementation
    (the only one that returns probabilities in transformers 5); the previous mode and
    implementation are restored afterwards. A forward hook on each layer's self-attention module
    reduces that layer's (n, H, T, T) maps to (n, H, B * B) and merges them into that layer's running
    statistics at once, so the maps of different layers are never held together, and the pass stops
    right after the last layer's attention.

    References
    ----------
    Paper Section III-B.
    """
    adapter = get_adapter(model)
    layers = adapter.layers(model)
    n_layers, n_heads = len(layers), adapter.num_heads(model.config)
    device = next(model.parameters()).device
    # One accumulator per layer, updated inside that layer's hook: the per-batch temporaries stay
    # layer-sized (cache-friendly) instead of covering all N heads at once.
    moments = [ClassMoments(num_classes, n_heads * resolution * resolution, device=device) for _ in layers]
    current: dict[str, torch.Tensor] = {}
    captured = [False] * n_layers

    def make_hook(index: int) -> Callable[..., None]:
        def hook(_module: nn.Module, _args: object, output: object) -> None:
            weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
            if weights is None:
                raise PipelineError(
                    "the attention module returned no attention probabilities; the eager attention "
                    "implementation is required and could not be enabled for this model"
                )
            resized = crop_and_resize(weights, current["mask"], resolution)
            moments[index].update(resized.reshape(resized.shape[0], -1), current["labels"])
            captured[index] = True
            if index == n_layers - 1:
                # Nothing after the last attention block (its feed-forward, the pooler, the
                # classifier) changes a signature: stop the pass here instead of computing them.
                raise _AllLayersCaptured

        return hook

    was_training = model.training
    model.eval()
    handles = [adapter.attention(layer).module.register_forward_hook(make_hook(i)) for i, layer in enumerate(layers)]
    try:
        with eager_attention(model), torch.no_grad():
            for batch in batches:
                labels = batch["labels"]
                if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
                    raise DatasetError(f"labels must be integers in 0..{num_classes - 1}")
                current["mask"] = batch["attention_mask"]
                current["labels"] = labels
                inputs = {k: v for k, v in batch.items() if k != "labels"}
                try:
                    model(**inputs)
                except _AllLayersCaptured:
                    pass
                if not all(captured):
                    raise PipelineError("an attention layer did not run; cannot build its signature")
                captured[:] = [False] * n_layers
                if on_batch is not None:
                    on_batch(int(labels.numel()))
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    parts = [m.finalize() for m in moments]
    shape = (num_classes, n_layers * n_heads, resolution * resolution)
    return Signatures(
        mean=np.concatenate([p[0] for p in parts], axis=1).reshape(shape),
        var=np.concatenate([p[1] for p in parts], axis=1).reshape(shape),
        counts=parts[0][2],
        resolution=resolution,
        num_layers=n_layers,
        num_heads=n_heads,
    )


def default_resolution(lengths: np.ndarray, *, percentile: float = 70.0) -> int:
    """The paper's rule for B: the 70th percentile of the tokenised training lengths (at least 2).

    References
    ----------
    Paper Section IV-B.1.
    """
    if len(lengths) == 0:
        raise DatasetError("cannot choose a resolution from an empty training split")
    return max(2, int(round(float(np.percentile(lengths, percentile)))))
