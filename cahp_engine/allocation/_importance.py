"""Importance of every attention head and feed-forward neuron, from one calibration pass.

Both kinds of unit are gated by a multiplicative mask at 1 (:func:`cahp_engine.models.gate_heads`,
:func:`cahp_engine.models.gate_neurons`) and scored by the loss's gradient with respect to it, so a head
and a neuron are scored on one scale: the predicted increase of the loss when the unit is removed. That
common scale is what lets the allocation trade a head against a block of neurons.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from cahp_engine._torch import frozen_in_eval
from cahp_engine.errors import InvalidInputError, PipelineError
from cahp_engine.models import gate_heads, gate_neurons, heads_per_layer, neurons_per_layer

ImportanceKind = Literal["fisher", "taylor"]
IMPORTANCE_KINDS: tuple[str, ...] = ("fisher", "taylor")


@dataclass(frozen=True)
class UnitImportance:
    """Scores of every head and neuron of an unpruned model; higher = more important.

    Attributes
    ----------
    heads : Tensor of shape (L, H), float64
    neurons : Tensor of shape (L, I), float64
    kind : {"fisher", "taylor"}
    batches : int
        Calibration batches the scores average over.
    """

    heads: torch.Tensor
    neurons: torch.Tensor
    kind: str
    batches: int


def unit_importance(
    model: nn.Module, batches: Iterable[dict[str, torch.Tensor]], *, kind: ImportanceKind = "fisher"
) -> UnitImportance:
    """Fisher or Taylor importance of each head and each feed-forward neuron.

    Parameters
    ----------
    model : an unpruned supported sequence classifier
    batches : iterable of dicts with ``input_ids``, ``attention_mask``, ``labels`` (n,) and optionally
        ``token_type_ids``
    kind : {"fisher", "taylor"}
        ``"fisher"``: mean over batches of ``(dL/dm)^2``, the diagonal of the empirical Fisher
        information of the mask, which approximates the loss's increase when the unit is removed.
        ``"taylor"``: mean of ``|dL/dm|``, the first-order term (the head salience of CAHP, Eq. 6).

    Returns
    -------
    UnitImportance
        ``heads`` (L, H) and ``neurons`` (L, I), float64, on the CPU, not normalised.

    Notes
    -----
    The model runs in ``eval()`` mode with its parameters frozen for the pass (no weight gradients are
    stored); both are restored afterwards. The gradient is the mean loss's over a batch, so the Fisher
    score is over batches, not single examples: coarser than Kwon et al.'s per-example Fisher, at one
    backward pass per batch.

    References
    ----------
    Kwon et al. 2022, "A Fast Post-Training Pruning Framework for Transformers", Eq. 4 (Fisher
    information of the mask); Michel et al. 2019 and the CAHP paper, Eq. 6 (the Taylor score).
    """
    if kind not in IMPORTANCE_KINDS:
        raise InvalidInputError(f"`kind` must be one of {', '.join(IMPORTANCE_KINDS)}, got {kind!r}")
    heads, neurons = heads_per_layer(model), neurons_per_layer(model)
    if len(set(heads)) != 1 or len(set(neurons)) != 1:
        raise PipelineError("unit importance is computed on the unpruned model; this one has pruned layers")
    device = next(model.parameters()).device
    head_gates = torch.ones(len(heads), heads[0], device=device, requires_grad=True)
    neuron_gates = torch.ones(len(neurons), neurons[0], device=device, requires_grad=True)
    totals = [torch.zeros(g.shape, dtype=torch.float64, device=device) for g in (head_gates, neuron_gates)]
    seen = 0
    with frozen_in_eval(model), gate_heads(model, list(head_gates.unbind(0))), \
            gate_neurons(model, list(neuron_gates.unbind(0))), torch.enable_grad():
        for batch in batches:
            out = model(**batch)
            if out.loss is None:
                raise PipelineError("the model returned no loss; batches must carry `labels`")
            grads = torch.autograd.grad(out.loss, (head_gates, neuron_gates))
            for total, grad in zip(totals, grads, strict=True):
                total += grad.to(torch.float64).square() if kind == "fisher" else grad.to(torch.float64).abs()
            seen += 1
    if seen == 0:
        raise PipelineError("no calibration batches: cannot compute unit importance")
    return UnitImportance(heads=(totals[0] / seen).cpu(), neurons=(totals[1] / seen).cpu(), kind=kind, batches=seen)
