"""Which original units (attention heads, feed-forward neurons) each layer keeps: the checks that head
surgery (:mod:`._surgery`) and neuron surgery (:mod:`._neurons`) share.

Both number a layer's units in the ORIGINAL architecture, read what was kept from the config's ``cahp``
record, and check a user's ``kept`` mapping against what the model still has; only the words of their
messages differ (:class:`Units`).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cahp_engine.errors import InvalidInputError, ModelLoadError, PipelineError


@dataclass(frozen=True)
class Units:
    """The words a kind of unit is named by in the messages.

    Attributes
    ----------
    noun : str
        One unit (``head``); its plural adds an ``s``.
    counted : str
        What a per-layer count counts (``heads``, ``feed-forward neurons``).
    modules : str
        Where the count is read from (``attention modules``).
    record : str
        The record that holds the original numbering (``\\`cahp\\```).
    entry, all_layers : str
        Words of the record's messages: ``non-integer <entry>``, ``must list <all_layers> L layers``.
    preview : int or None
        How many indices a message about a record's layer shows (None: all of them).
    full_lists : bool
        Whether the messages about a ``kept`` mapping list the indices concerned.
    """

    noun: str
    counted: str
    modules: str
    record: str
    entry: str
    all_layers: str
    preview: int | None
    full_lists: bool


HEADS = Units("head", "heads", "attention modules", "`cahp`", "entry", "all", None, True)
NEURONS = Units("neuron", "feed-forward neurons", "feed-forward projections", "`kept_neurons`", "neuron entry",
                "the neurons of all", 8, False)


def current_kept(units: Units, recorded: dict[int, tuple[int, ...]] | None, shapes: list[int],
                 total: int) -> list[tuple[int, ...]]:
    """The original indices of the units each layer has now, from the record (``range(total)`` without one).

    Raises
    ------
    PipelineError
        If the record disagrees with ``shapes`` (the units each layer has), or a model without a record
        has layers narrower than ``total``.
    """
    if recorded is None:
        if any(count != total for count in shapes):
            raise PipelineError(
                f"the model has {shapes} {units.counted} per layer but its config says {total} and carries no "
                f"{units.record} record, so the original {units.noun} indices are unknown"
            )
        return [tuple(range(total)) for _ in shapes]
    kept = [recorded.get(index, ()) for index in range(len(shapes))]
    if [len(k) for k in kept] != shapes:
        raise PipelineError(
            f"the model's `cahp` record keeps {[len(k) for k in kept]} {units.noun}s per layer but its "
            f"{units.modules} have {shapes}"
        )
    return kept


def parse_kept(units: Units, where: str, entries: Mapping[Any, Any], *, layers: int,
               total: int) -> dict[int, tuple[int, ...]]:
    """A record's ``layer -> kept original indices`` mapping, checked: every layer, distinct indices in range.

    Raises
    ------
    ModelLoadError
        If an entry is not integers, out of range, repeated, or a layer is missing.
    """
    parsed: dict[int, tuple[int, ...]] = {}
    for key, values in entries.items():
        try:
            layer = int(key)
            indices = tuple(sorted(operator.index(v) for v in values))
        except (TypeError, ValueError) as exc:
            raise ModelLoadError(f"{where} has a non-integer {units.entry} for layer {key!r}") from exc
        in_range = 0 <= layer < layers and all(0 <= i < total for i in indices)
        if not in_range or len(set(indices)) < len(indices):
            shown = list(indices) if units.preview is None else f"{list(indices)[:units.preview]}..."
            raise ModelLoadError(
                f"{where} keeps {units.noun}s {shown} in layer {key!r}; layers must be in [0, {layers}) and "
                f"{units.noun}s distinct and in [0, {total})"
            )
        parsed[layer] = indices
    # A record lists every layer; a missing one would silently mean "none kept".
    if set(parsed) != set(range(layers)):
        raise ModelLoadError(f"{where} must list {units.all_layers} {layers} layers, got {sorted(parsed)}")
    return parsed


def plan_kept(units: Units, kept: Mapping[int, Sequence[int]], current: list[tuple[int, ...]],
              total: int) -> list[tuple[int, ...]]:
    """Validate a user's ``kept`` against the units each layer has now; the units each layer will keep.

    Raises
    ------
    InvalidInputError
        If a layer or unit index is out of range, repeated, or names a unit already removed.
    """
    if not isinstance(kept, Mapping):
        raise InvalidInputError(f"`kept` must map layer index -> {units.noun} indices, got {type(kept).__name__}")
    plan = list(current)
    for raw_layer, raw in kept.items():
        layer = as_index(raw_layer, "layer index")
        if not 0 <= layer < len(current):
            raise InvalidInputError(f"layer index must be in [0, {len(current)}), got {raw_layer!r}")
        if isinstance(raw, str | bytes) or not isinstance(raw, Iterable):
            raise InvalidInputError(f"{units.noun}s to keep in layer {layer} must be a sequence of ints, got {raw!r}")
        chosen = [as_index(i, f"{units.noun} index in layer {layer}") for i in raw]
        have = set(current[layer])
        for index in chosen:
            if not 0 <= index < total:
                raise InvalidInputError(
                    f"{units.noun} index in layer {layer} must be in [0, {total}) (original numbering), got {index}"
                )
            if index not in have:
                still = f"; that layer still has {units.noun}s {list(current[layer])}" if units.full_lists else ""
                raise InvalidInputError(
                    f"{units.noun} {index} of layer {layer} was already removed by an earlier pruning{still}")
        if len(set(chosen)) != len(chosen):
            repeated = f": {chosen}" if units.full_lists else ""
            raise InvalidInputError(f"{units.noun}s to keep in layer {layer} repeat an index{repeated}")
        plan[layer] = tuple(sorted(chosen))
    return plan


def changed_layers(current: Sequence[tuple[int, ...]],
                   plan: Sequence[tuple[int, ...]]) -> Iterator[tuple[int, list[int]]]:
    """Each layer whose ``plan`` differs from the units it has now, with the current positions of those it keeps.

    Surgery slices by position in the layer as it is now; the plan and the record speak of original indices.
    """
    for layer, (now, new) in enumerate(zip(current, plan, strict=True)):
        if new != now:
            yield layer, [now.index(unit) for unit in new]


def as_index(value: Any, what: str) -> int:
    """``value`` as an index (an int, not a bool), or an InvalidInputError naming ``what``."""
    if isinstance(value, bool):
        raise InvalidInputError(f"{what} must be an int, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise InvalidInputError(f"{what} must be an int, got {value!r}") from None
