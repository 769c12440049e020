"""Layer-wise reconstruction: recovery without gradient training.

After pruning, :func:`reconstruct` goes through the layers in order and refits the projection that reads
each pruned sub-layer's kept units, so that the layer's output, computed from the *pruned* model's own
previous layer, matches the dense model's. Each refit is a linear least-squares problem over the
calibration tokens (:mod:`cahp_engine.recovery._least_squares`); each system runs its own layer alone,
from the previous layer's output kept in memory where the family allows it (:mod:`cahp_engine.recovery._passes`),
so the whole pass costs a few forward passes over the calibration batches and one solve per system:
seconds on a CPU.

Sub-layers
----------
``options.sublayers`` names the sub-layer outputs to refit, generically: each name maps to the
projection whose *input columns are the units* a pruning keeps.

``"attention"``
    The attention output projection (BERT's ``attention.output.dense``, ModernBERT's ``attn.Wo``); its
    input is the kept heads' context vectors, ``head_dim`` columns per head.
``"ffn"``
    The feed-forward output projection (BERT's ``output.dense``, DistilBERT's ``ffn.lin2``,
    ModernBERT's ``mlp.Wo``); its input is the kept intermediate neurons, one column each. A pruning of
    FFN neurons calls :func:`reconstruct` with ``sublayers=("ffn",)`` (or both).

The dense and the pruned model only need the same family and layer count: any unit count per layer,
including the full one, is refit the same way.

Targets
-------
With ``target="residual"`` the refit attention projection ``A`` of the pruned layer must make
``h_p + A(x_p)`` equal the dense ``h_d + A_d(x_d)``: ``h`` is the layer's input, which every supported
family adds back after its attention (before or after a LayerNorm), so the refit also absorbs the
drift of the layers below. With ``target="block"`` it matches the dense block's output ``A_d(x_d)``
alone. ``ffn_target`` does the same for the feed-forward projection ``F``: ``"residual"`` makes
``r_p + F(a_p)`` equal ``r_d + F_d(a_d)``, where ``r`` is what the family adds the feed-forward block's
output to (the attention sub-layer's output; :data:`~cahp_engine.recovery._passes.FFN_RESIDUAL` says
where each family passes it), so the refit also absorbs what the attention refit of the same layer left;
``"block"`` matches ``F_d(a_d)`` alone.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
from torch import nn

from cahp_engine.errors import InvalidInputError, UnsupportedModelError
from cahp_engine.models import get_adapter
from cahp_engine.recovery._least_squares import NormalEquations, Solution, solve_ridge, solve_scales
from cahp_engine.recovery._passes import (
    Calls,
    advance,
    capture,
    capture_all,
    layer_calls,
    output_projection,
    rows_at,
)
from cahp_engine.recovery._reconstruction_records import LayerFit, Reconstruction

Sublayer = Literal["attention", "ffn"]
Method = Literal["ridge", "scales"]
Target = Literal["residual", "block"]
Shortfall = Literal["refuse", "skip"]
SUBLAYERS: tuple[str, ...] = get_args(Sublayer)
METHODS: tuple[str, ...] = get_args(Method)
TARGETS: tuple[str, ...] = get_args(Target)
SHORTFALLS: tuple[str, ...] = get_args(Shortfall)


@dataclass(frozen=True)
class ReconstructionOptions:
    """How :func:`reconstruct` refits.

    Attributes
    ----------
    sublayers : tuple of {"attention", "ffn"}
        The sub-layer outputs refit in each layer, in this order.
    method : {"ridge", "scales"}
        ``ridge`` refits the whole projection; ``scales`` one scale per kept unit (Kwon et al.'s mask
        tuning), a much smaller system.
    target : {"residual", "block"}
        What the attention refit matches (see the module's notes).
    ffn_target : {"residual", "block"}
        What the feed-forward refit matches (see the module's notes).
    alpha : float
        The ridge term relative to the system's mean diagonal (> 0).
    max_rows : int or None
        Calibration tokens used per system, drawn at random with the seed when the batches hold more.
    short : {"refuse", "skip"}
        What a system with more unknowns than calibration tokens does: ``refuse`` raises before any
        work (the message names the tokens needed); ``skip`` leaves that projection as pruned, with a
        note, and refits the others (for a run that fine-tunes afterwards, which recovers the rest).
        A feed-forward block that kept every neuron lost nothing and is skipped either way.
    """

    sublayers: tuple[str, ...] = ("attention",)
    method: str = "ridge"
    target: str = "residual"
    ffn_target: str = "block"
    alpha: float = 1e-2
    max_rows: int | None = None
    short: str = "refuse"

    def __post_init__(self) -> None:
        if not self.sublayers or any(s not in SUBLAYERS for s in self.sublayers):
            raise InvalidInputError(f"`sublayers` must be a non-empty tuple of {SUBLAYERS}, got {self.sublayers!r}")
        for name, allowed in (("method", METHODS), ("target", TARGETS), ("ffn_target", TARGETS),
                              ("short", SHORTFALLS)):
            if getattr(self, name) not in allowed:
                raise InvalidInputError(f"`{name}` must be one of {allowed}, got {getattr(self, name)!r}")
        if not self.alpha > 0:
            raise InvalidInputError(f"`alpha` must be a number > 0, got {self.alpha!r}")
        if self.max_rows is not None and self.max_rows < 1:
            raise InvalidInputError(f"`max_rows` must be an integer >= 1 or None, got {self.max_rows!r}")


def unsupported_reason(model: nn.Module, options: ReconstructionOptions) -> str | None:
    """Why ``model``'s family cannot be reconstructed with ``options``, or None when it can."""
    adapter = get_adapter(model)
    layers = adapter.layers(model)
    for name in options.sublayers:
        try:
            projection = output_projection(adapter, layers[0], name)
        except AttributeError:
            return f"the {adapter.family} family has no {name} output projection where cahp looks for it"
        if not isinstance(projection, nn.Linear):
            return f"the {adapter.family} family's {name} output projection is not a linear layer"
    return None


def reconstruct(
    dense: nn.Module,
    pruned: nn.Module,
    batches: Sequence[Mapping[str, torch.Tensor]],
    options: ReconstructionOptions | None = None,
    *,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
    should_cancel: Callable[[], bool] | None = None,
) -> Reconstruction:
    """Refit ``pruned``'s kept units, layer by layer, to reproduce ``dense``'s layer outputs (in place).

    Parameters
    ----------
    dense : a supported ``*ForSequenceClassification`` model, unchanged
    pruned : the same model with units removed; its refit projections are overwritten
    batches : sequence of dicts of tensors
        Calibration batches as :func:`~cahp_engine.data.collate` makes them: ``input_ids`` (B, T),
        ``attention_mask`` (B, T), optionally ``token_type_ids``; every real token is one row.
    options : ReconstructionOptions, optional
    seed : int
        Draws the tokens kept when ``options.max_rows`` is below the tokens given; otherwise the
        result does not depend on it (the sums are accumulated in a fixed order, in float64).
    progress : callable(done, total), optional
        Called after each refit projection.
    should_cancel : callable() -> bool, optional
        Checked between projections; True raises :class:`~cahp_engine.errors.JobCancelledError`.

    Returns
    -------
    Reconstruction

    Raises
    ------
    UnsupportedModelError
        Before any work, when the family cannot be reconstructed (:func:`unsupported_reason`).
    InvalidInputError
        When a layer's system has more unknowns than calibration tokens and ``options.short`` is
        ``refuse`` (the message names the rows needed), or when the two models do not match.

    References
    ----------
    Kwon et al. (2022), "A Fast Post-Training Pruning Framework for Transformers", Section 4.3 (mask
    tuning by layer-wise linear least squares).
    """
    from cahp_engine.errors import JobCancelledError

    options = options or ReconstructionOptions()
    started = time.perf_counter()
    adapter = get_adapter(pruned)
    reason = unsupported_reason(pruned, options)
    if reason is not None:
        raise UnsupportedModelError(f"layer-wise reconstruction cannot run: {reason}")
    if get_adapter(dense).family != adapter.family or len(adapter.layers(dense)) != len(adapter.layers(pruned)):
        raise InvalidInputError("the dense and the pruned model must be the same family with the same layers")
    batches = list(batches)
    keep = _row_masks(batches, options.max_rows, seed)
    rows = int(sum(int(k.sum()) for k in keep))
    head_dim = adapter.head_dim(pruned.config)
    plan = [(i, name) for i in range(len(adapter.layers(pruned))) for name in options.sublayers]
    refit, notes = _without_systems_short_of_rows(_Refit(dense, pruned, adapter, plan, batches, keep, options),
                                                  rows, head_dim)
    _check_rows(refit, rows, head_dim, texts=int(sum(int(k.any(dim=1).sum()) for k in keep)))
    fits: list[LayerFit] = []
    dense_training, pruned_training = dense.training, pruned.training
    dense.eval()
    pruned.eval()
    try:
        with torch.no_grad():
            targets = _dense_targets(refit)
            calls = layer_calls(pruned, adapter, batches, keep)
            for done, (index, name) in enumerate(refit.plan, start=1):
                if should_cancel is not None and should_cancel():
                    raise JobCancelledError("cancelled during layer-wise reconstruction")
                if calls is not None:
                    calls = advance(adapter.layers(pruned), calls, index)
                projection = output_projection(adapter, adapter.layers(pruned)[index], name)
                if projection.in_features == 0:
                    notes.append(f"layer {index} keeps no {name} units: nothing to refit")
                    continue
                system = _accumulate(refit, index, name, None if targets is None else targets[(index, name)], calls)
                unit = head_dim if name == "attention" else 1
                solution = _solve(system, projection, options, unit)
                _write(projection, solution)
                fits.append(LayerFit(
                    layer=index, sublayer=name, units=projection.in_features // unit, unknowns=_unknowns(
                        projection, options, unit), rows=system.rows, error_before=solution.error_before,
                    error_after=solution.error_after, ridge=solution.ridge, condition=solution.condition,
                    ill_conditioned=solution.ill_conditioned))
                if progress is not None:
                    progress(done, len(refit.plan))
    finally:
        dense.train(dense_training)
        pruned.train(pruned_training)
    for fit in fits:
        if fit.ill_conditioned:
            notes.append(f"layer {fit.layer} {fit.sublayer}: ill-conditioned system (condition {fit.condition:.2g}); "
                         f"the ridge term {fit.ridge:.3g} kept the unseen directions at their trained weights")
    return Reconstruction(fits=tuple(fits), method=options.method, target=options.target, alpha=options.alpha,
                          rows=rows, seconds=time.perf_counter() - started, notes=tuple(notes),
                          ffn_target=options.ffn_target if "ffn" in options.sublayers else None)


def _without_systems_short_of_rows(refit: _Refit, rows: int, head_dim: int) -> tuple[_Refit, list[str]]:
    """``refit`` without the systems that have fewer calibration tokens than unknowns and can be left as they
    are, with a note naming them: the feed-forward systems of blocks that kept every neuron (they lost
    nothing, so they stay as trained), and, when ``options.short`` is ``skip``, every other such system (it
    stays as pruned, for the fine-tuning that follows to recover)."""
    adapter, options = refit.adapter, refit.options
    kept: list[tuple[int, str]] = []
    whole: list[tuple[int, int]] = []  # (layer, unknowns) of feed-forward blocks that kept every neuron
    cut: list[tuple[int, str, int]] = []  # (layer, sublayer, unknowns) of the other short systems, under skip
    for index, name in refit.plan:
        projection = output_projection(adapter, adapter.layers(refit.pruned)[index], name)
        needed = _unknowns(projection, options, head_dim if name == "attention" else 1)
        if not projection.in_features or rows >= needed:
            kept.append((index, name))
        elif name == "ffn" and projection.in_features == output_projection(
                adapter, adapter.layers(refit.dense)[index], name).in_features:
            whole.append((index, needed))
        elif options.short == "skip":
            cut.append((index, name, needed))
        else:
            kept.append((index, name))  # refused by _check_rows, with the tokens it needs
    notes = []
    if whole:
        notes.append(f"the feed-forward blocks of layer(s) {', '.join(str(i) for i, _ in whole)} keep all their "
                     f"neurons and their refit needs {max(n for _, n in whole)} calibration tokens, got {rows}: "
                     "left as trained")
    if cut:
        labels = {"attention": "attention", "ffn": "feed-forward"}
        named = " and ".join(f"the {label} refit of layer(s) {', '.join(str(i) for i, n, _ in cut if n == name)}"
                             for name, label in labels.items() if any(n == name for _, n, _ in cut))
        notes.append(f"{named} need up to {max(n for _, _, n in cut)} calibration tokens, got {rows}: left as "
                     f"pruned for fine-tuning to recover; more calibration texts (`reconstruction_rows`) would "
                     "refit them")
    if not notes:
        return refit, []
    return dataclasses.replace(refit, plan=kept), notes


def _wants_residual(options: ReconstructionOptions, name: str) -> bool:
    return (options.target if name == "attention" else options.ffn_target) == "residual"


def _unknowns(projection: nn.Linear, options: ReconstructionOptions, unit: int) -> int:
    if options.method == "scales":
        return projection.in_features // unit
    return projection.in_features + (1 if projection.bias is not None else 0)


@dataclass(frozen=True)
class _Refit:
    """What every system of one :func:`reconstruct` shares: the two models, the plan of
    ``(layer, sublayer)`` systems, the calibration batches with their kept tokens, and the options."""

    dense: nn.Module
    pruned: nn.Module
    adapter: Any
    plan: list[tuple[int, str]]
    batches: list[Mapping[str, torch.Tensor]]
    keep: list[torch.Tensor]
    options: ReconstructionOptions


def _check_rows(refit: _Refit, rows: int, head_dim: int, *, texts: int) -> None:
    """Refuse calibration rows (tokens) fewer than the largest system's unknowns, naming that system and,
    at the mean length of the ``texts`` given, how many texts would be enough."""
    adapter, pruned, plan, options = refit.adapter, refit.pruned, refit.plan, refit.options
    needs = []
    for index, name in plan:
        projection = output_projection(adapter, adapter.layers(pruned)[index], name)
        if projection.in_features:
            needs.append((_unknowns(projection, options, head_dim if name == "attention" else 1), index, name))
    if not needs:
        return
    needed, index, name = max(needs)
    if rows < needed:
        raise InvalidInputError(
            f"layer-wise reconstruction needs at least {needed} calibration tokens (layer {index}'s {name} refit "
            f"has {needed} unknowns per output), got {rows}"
            + (f" from {texts} text(s); at their mean length of {rows / texts:.0f} tokens that takes at least "
               f"{math.ceil(needed * texts / rows)} texts" if rows and texts else "")
            + "; give more calibration texts (a run's `reconstruction_rows`)"
            + (f" or raise `max_rows` above {options.max_rows}" if options.max_rows is not None else ""))


def _row_masks(batches: list[Mapping[str, torch.Tensor]], max_rows: int | None, seed: int) -> list[torch.Tensor]:
    """Which tokens of each batch are calibration rows: the real ones, thinned at random to ``max_rows``."""
    masks = [b["attention_mask"].to("cpu").bool() for b in batches]
    total = int(sum(int(m.sum()) for m in masks))
    if max_rows is None or total <= max_rows:
        return masks
    generator = torch.Generator().manual_seed(seed)
    scores = [torch.rand(m.shape, generator=generator) for m in masks]
    flat = torch.cat([s[m] for s, m in zip(scores, masks, strict=True)])
    cut = torch.kthvalue(flat, max_rows).values
    return [m & (s <= cut) for s, m in zip(scores, masks, strict=True)]


#: The dense model's targets are kept in memory, from one dense pass, up to this many bytes (float32); above
#: it each layer's system runs the dense model again up to that layer (about (L + 1) / 2 passes in all).
TARGET_CACHE_BYTES = 1 << 30


def _dense_targets(refit: _Refit) -> dict[tuple[int, str], list[torch.Tensor | None]] | None:
    """Every system's dense side (``A_d(x_d)``, plus ``h_d`` or ``r_d`` for a residual target) from one pass, or None
    when they would take more than :data:`TARGET_CACHE_BYTES`."""
    dense, adapter, plan, batches, keep = refit.dense, refit.adapter, refit.plan, refit.batches, refit.keep
    layers = adapter.layers(dense)
    rows = int(sum(int(k.sum()) for k in keep))
    if rows * sum(output_projection(adapter, layers[i], n).out_features for i, n in plan) * 4 > TARGET_CACHE_BYTES:
        return None
    out: dict[tuple[int, str], list[torch.Tensor | None]] = {key: [] for key in plan}
    for batch, kept in zip(batches, keep, strict=True):
        if not bool(kept.any()):
            for key in plan:
                out[key].append(None)
            continue
        residual, output = capture_all(dense, adapter, plan, batch)
        for key in plan:
            target = rows_at(output.get(key), kept)
            if _wants_residual(refit.options, key[1]):
                target = target + rows_at(residual.get(key), kept)
            out[key].append(target.detach().to("cpu", torch.float32))
    return out


def _accumulate(refit: _Refit, index: int, name: str, cached: list[torch.Tensor | None] | None,
                calls: Calls | None) -> NormalEquations:
    dense, pruned, adapter = refit.dense, refit.pruned, refit.adapter
    projection = output_projection(adapter, adapter.layers(pruned)[index], name)
    system = NormalEquations(projection.in_features, projection.out_features)
    residual = _wants_residual(refit.options, name)
    for b, (batch, rows) in enumerate(zip(refit.batches, refit.keep, strict=True)):
        if not bool(rows.any()):
            continue
        have = capture(pruned, adapter, (index, name), batch, None if calls is None else calls.call(b))
        known = None if cached is None else cached[b]
        if known is not None:
            target = known.to(torch.float64)
        else:
            want = capture(dense, adapter, (index, name), batch)
            dense_projection = output_projection(adapter, adapter.layers(dense)[index], name)
            target = rows_at(dense_projection(want.input), rows).to("cpu", torch.float64)
            if residual:
                target = target + rows_at(want.residual, rows).to("cpu", torch.float64)
        if residual:
            target = target - rows_at(have.residual, rows).to("cpu", torch.float64)
        system.add(rows_at(have.input, rows), target)
    return system


def _solve(system: NormalEquations, projection: nn.Linear, options: ReconstructionOptions, unit: int) -> Solution:
    weight, bias = projection.weight.detach(), None if projection.bias is None else projection.bias.detach()
    if options.method == "scales":
        return solve_scales(system, weight, bias, unit=unit, alpha=options.alpha)
    return solve_ridge(system, weight, bias, alpha=options.alpha)


def _write(projection: nn.Linear, solution: Solution) -> None:
    projection.weight.copy_(solution.weight.to(projection.weight.dtype))
    if projection.bias is not None:
        projection.bias.copy_(solution.bias.to(projection.bias.dtype))
