"""Head importance: a protocol, and CAHP's gradient salience as its main implementation.

References
----------
Paper Section III-D, Eq. 6 (gradient of the loss with respect to a multiplicative head mask,
min-max normalised).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import torch
from torch import nn

from cahp_engine._torch import frozen_in_eval
from cahp_engine.errors import PipelineError
from cahp_engine.models import gate_heads, get_adapter, heads_per_layer


class HeadImportance(Protocol):
    """``(model, batches) -> Tensor of shape (L, H)``: a score per head, higher = more important.

    :func:`cahp_engine.selection.analyze_heads` takes one (``importance=``) and min-max normalises
    its scores; :func:`gradient_salience` is the default.
    """

    def __call__(self, model: nn.Module, batches: Iterable[dict[str, torch.Tensor]]) -> torch.Tensor: ...


def gradient_salience(model: nn.Module, batches: Iterable[dict[str, torch.Tensor]]) -> torch.Tensor:
    """Mean absolute gradient of the loss with respect to each head's output gate.

    Parameters
    ----------
    model : an unpruned supported sequence classifier
    batches : iterable of dicts with ``input_ids``, ``attention_mask``, ``labels`` (n,) and
        optionally ``token_type_ids``

    Returns
    -------
    Tensor of shape (L, H), float64, on the CPU
        ``mean over batches of |dL/dg_{l,h}|`` at g = 1, where L is the batch's mean cross-entropy.
        Not normalised; see :func:`minmax`.

    Notes
    -----
    Gates multiply the heads' outputs through a pre-hook on the attention output projection
    (:func:`cahp_engine.models.gate_heads`). The model runs in ``eval()`` mode (no dropout noise),
    its parameters are frozen for the pass so no weight gradients are computed or stored, and both
    the mode and the ``requires_grad`` flags are restored afterwards.

    References
    ----------
    Paper Eq. 6.
    """
    heads = heads_per_layer(model)
    if len(set(heads)) != 1:
        raise PipelineError("salience is computed on the unpruned model; this one has pruned layers")
    get_adapter(model)  # fails early for unsupported families
    device = next(model.parameters()).device
    gates = torch.ones(len(heads), heads[0], device=device, requires_grad=True)
    total = torch.zeros(len(heads), heads[0], dtype=torch.float64, device=device)
    seen = 0
    with frozen_in_eval(model), gate_heads(model, list(gates.unbind(0))), torch.enable_grad():
        for batch in batches:
            out = model(**batch)
            if out.loss is None:
                raise PipelineError("the model returned no loss; batches must carry `labels`")
            (grad,) = torch.autograd.grad(out.loss, gates)
            total += grad.abs().to(torch.float64)
            seen += 1
    if seen == 0:
        raise PipelineError("no calibration batches: cannot compute salience")
    return (total / seen).cpu()


def minmax(scores: torch.Tensor) -> torch.Tensor:
    """Min-max normalise to [0, 1]; a constant tensor maps to all zeros."""
    lo, hi = scores.min(), scores.max()
    if float(hi - lo) <= 0:
        return torch.zeros_like(scores)
    return (scores - lo) / (hi - lo)
