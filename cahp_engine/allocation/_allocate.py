"""How many heads and neurons each layer keeps to meet a cost target at the least predicted loss.

Every head and neuron is a unit with an importance (the predicted loss of removing it,
:mod:`cahp_engine.allocation._importance`) and a cost (:mod:`cahp_engine.allocation._costs`). Under a
cost that is linear in the units kept, removing units in ascending order of importance per unit of cost
until the budget is met is the greedy answer to the knapsack problem, exact for its fractional
relaxation. Each layer keeps at least its most important head and neuron, so no sub-layer is dropped
by an allocation; that floor bounds what a target can reach.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from cahp_engine.allocation._costs import CostModel
from cahp_engine.allocation._importance import UnitImportance
from cahp_engine.errors import InvalidInputError


class TargetUnreachableError(InvalidInputError):
    """The target asks for more than keeping one head and one neuron per layer gives.

    ``best`` is the most that is reachable, in the target's own terms (a speed-up, or a fraction of
    the dense FLOPs). Its ``code``, ``target_unreachable``, is what a failed job records.
    """

    code = "target_unreachable"

    def __init__(self, message: str, *, best: float) -> None:
        super().__init__(message)
        self.best = best


@dataclass(frozen=True)
class Allocation:
    """The units each layer keeps.

    Attributes
    ----------
    kept_heads, kept_neurons : tuple of L tuples of int
        Original indices kept in each layer, the most important ones, ascending.
    predicted_cost, dense_cost : float
        The cost model's prediction for the allocation and for the unpruned model.
    predicted_speedup : float
        ``dense_cost / predicted_cost``.
    predicted_loss : float
        Sum of the importance of the removed units.
    unit : str
        The cost model's unit ("seconds" or "flops").
    """

    kept_heads: tuple[tuple[int, ...], ...]
    kept_neurons: tuple[tuple[int, ...], ...]
    predicted_cost: float
    dense_cost: float
    predicted_speedup: float
    predicted_loss: float
    unit: str

    @property
    def heads_per_layer(self) -> tuple[int, ...]:
        return tuple(len(h) for h in self.kept_heads)

    @property
    def neurons_per_layer(self) -> tuple[int, ...]:
        return tuple(len(n) for n in self.kept_neurons)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def reachable(costs: CostModel) -> float:
    """The largest speed-up an allocation can give under ``costs``: dense cost over one head and neuron per layer."""
    return costs.dense / costs.floor


def validate_target(*, target_speedup: float | None = None, target_flops: float | None = None) -> None:
    """Check a target's form before any work: exactly one, a speed-up >= 1 or a FLOPs fraction in (0, 1].

    Raises
    ------
    InvalidInputError
        Naming what to change.
    """
    if (target_speedup is None) == (target_flops is None):
        raise InvalidInputError("give exactly one of `target_speedup` and `target_flops`")
    if target_speedup is not None and not _number_at_least(target_speedup, 1.0):
        raise InvalidInputError(f"`target_speedup` must be a number >= 1, got {target_speedup!r}")
    if target_flops is not None and not (_number_at_least(target_flops, 0.0) and 0 < target_flops <= 1):
        raise InvalidInputError(f"`target_flops` must be a fraction of the dense FLOPs in (0, 1], got {target_flops!r}")


def _number_at_least(value: object, low: float) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value) and value >= low


def check_target(costs: CostModel, *, target_speedup: float | None = None, target_flops: float | None = None,
                 where: str | None = None) -> float:
    """Validate a target against ``costs`` and return the cost budget it sets.

    ``where`` names the shape the costs stand for in a refusal (by default ``costs``' batch and length,
    and its runtime, or "in FLOPs"): a caller whose shape is a stand-in (a serving length still unknown)
    says what the bound means.

    Raises
    ------
    InvalidInputError
        If neither or both targets are given, or ``target_speedup`` is below 1 or ``target_flops``
        outside (0, 1].
    TargetUnreachableError
        If the target is beyond what one head and one neuron per layer reach; the message names it.
    """
    validate_target(target_speedup=target_speedup, target_flops=target_flops)
    best = reachable(costs)
    if where is None:
        where = (f"at batch {costs.batch_size} x {costs.seq_len} tokens in FLOPs" if costs.runtime == "analytic"
                 else f"on {costs.runtime} at batch {costs.batch_size} x {costs.seq_len} tokens")
    if target_speedup is not None:
        if target_speedup > best:
            raise TargetUnreachableError(
                f"`target_speedup` {target_speedup:g} is beyond what this model reaches {where}: at most "
                f"x{best:.2f}, keeping one head and one neuron per layer; ask for at most "
                f"{math.floor(best * 100) / 100:g}",
                best=best,
            )
        return costs.dense / float(target_speedup)
    fraction = float(target_flops if target_flops is not None else 1.0)  # validate_target: one of the two is set
    smallest = 1.0 / best
    if fraction < smallest:
        raise TargetUnreachableError(
            f"`target_flops` {fraction:g} is below what this model can keep: at least {smallest:.4f} of its "
            "FLOPs, one head and one neuron per layer; ask for at least "
            f"{math.ceil(smallest * 10_000) / 10_000:g}",
            best=smallest,
        )
    return costs.dense * fraction


def allocate(
    importance: UnitImportance, costs: CostModel, *, target_speedup: float | None = None,
    target_flops: float | None = None,
) -> Allocation:
    """Choose the heads and neurons each layer keeps so the predicted cost meets the target.

    Parameters
    ----------
    importance : UnitImportance
        ``heads`` (L, H) and ``neurons`` (L, I) of the unpruned model.
    costs : CostModel
        Of the same architecture; in FLOPs for ``target_flops``, any unit for ``target_speedup``.
    target_speedup : float >= 1, optional
        The predicted cost must be at most ``dense / target_speedup``.
    target_flops : float in (0, 1], optional
        The predicted cost must be at most this fraction of the dense cost.

    Returns
    -------
    Allocation

    Raises
    ------
    InvalidInputError, TargetUnreachableError
        As :func:`check_target`; also if ``importance`` and ``costs`` describe different shapes.

    References
    ----------
    Kwon et al. 2022, Section 4.1 (mask search under a FLOPs or latency constraint).
    """
    heads, neurons = importance.heads.numpy(), importance.neurons.numpy()
    shape = (costs.num_layers, costs.num_heads, costs.num_neurons)
    if (heads.shape[0], heads.shape[1], neurons.shape[1]) != shape or neurons.shape[0] != costs.num_layers:
        raise InvalidInputError(f"importance of shape {tuple(heads.shape)} and {tuple(neurons.shape)} does not "
                                f"fit a cost model of {shape[0]} layers, {shape[1]} heads and {shape[2]} neurons")
    budget = check_target(costs, target_speedup=target_speedup, target_flops=target_flops)
    layers = costs.num_layers
    # Candidates for removal: every unit but each layer's most important head and neuron.
    scores, unit_cost, kinds, places = [], [], [], []
    for kind, table, cost in ((0, heads, costs.head), (1, neurons, costs.neuron)):
        order = np.argsort(-table, axis=1, kind="stable")[:, 1:]  # the first (most important) always stays
        rows = np.repeat(np.arange(layers), order.shape[1])
        scores.append(table[rows, order.reshape(-1)])
        unit_cost.append(np.full(rows.size, cost))
        kinds.append(np.full(rows.size, kind))
        places.append(np.stack([rows, order.reshape(-1)], axis=1))
    score, cost_of, kind_of, place = (np.concatenate(a) for a in (scores, unit_cost, kinds, places))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(cost_of > 0, score / np.where(cost_of > 0, cost_of, 1.0), np.inf)
    order = np.lexsort((kind_of, ratio))  # ties: heads first, then by position; deterministic
    saved = np.cumsum(cost_of[order])
    needed = costs.dense - budget
    count = 0 if needed <= 0 else int(np.searchsorted(saved, needed - 1e-12 * abs(costs.dense)) + 1)
    count = min(count, order.size)
    removed = order[:count]
    drop: list[list[set[int]]] = [[set(), set()] for _ in range(layers)]
    for index in removed:
        drop[place[index, 0]][kind_of[index]].add(int(place[index, 1]))
    kept_heads = tuple(tuple(h for h in range(costs.num_heads) if h not in drop[layer][0]) for layer in range(layers))
    kept_neurons = tuple(tuple(n for n in range(costs.num_neurons) if n not in drop[layer][1])
                         for layer in range(layers))
    predicted = costs.predict(np.array([len(h) for h in kept_heads]), np.array([len(n) for n in kept_neurons]))
    return Allocation(
        kept_heads=kept_heads, kept_neurons=kept_neurons, predicted_cost=predicted, dense_cost=costs.dense,
        predicted_speedup=costs.dense / predicted, predicted_loss=float(score[removed].sum()), unit=costs.unit,
    )
