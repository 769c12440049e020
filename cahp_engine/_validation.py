"""Parameter checks shared by the engine, in scikit-learn's style, importable without torch or numpy.

A constraint is an :class:`Interval` (integer or real, each end open, closed or absent), an
:class:`Options` set, or one of the named rules for settings that take more than one kind of value:
:class:`Amount` (a count, a fraction or a word), :class:`OffOr` (0 or an interval), :class:`TupleOf`,
:class:`SubsetOf` (distinct names from a set) and :class:`Device`. :func:`check` raises
:class:`~cahp_engine.errors.ConfigError` with the message "`name` must be <constraint>, got <value>",
e.g. "`poly_degree` must be an integer between 1 and 10, got 0". Booleans are neither integers nor reals
here, and a real must be finite.

References
----------
scikit-learn's ``sklearn.utils._param_validation`` (``Interval``, ``StrOptions``).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeGuard

from cahp_engine.errors import ConfigError

Closed = Literal["left", "right", "both", "neither"]

#: What ``device`` may say: ``auto`` picks CUDA when there is one (see ``cahp_engine._torch.resolve_device``).
DEVICE_NAMES = "auto, cpu, cuda or cuda:N"


def is_int(value: Any) -> bool:
    """An integral number that is not a bool (numpy integers count)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    """A finite real number that is not a bool (integers and numpy floats count; NaN and inf do not)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


class _Rule:
    """A rule whose words are the same for every value it refuses: ``describe`` is ``str(self)``."""

    def describe(self, value: object) -> str:
        """What a value must be, in the words of a message."""
        return str(self)


@dataclass(frozen=True)
class Interval(_Rule):
    """Numbers of one kind between two optional bounds.

    Parameters
    ----------
    kind : {"integer", "real"}
        ``integer`` accepts integral numbers only; ``real`` accepts any finite real, integers included.
    left, right : number or None
        The bounds; None leaves that side unbounded. They are printed as given (``0.0`` or ``0``).
    closed : {"left", "right", "both", "neither"}
        Which bounds belong to the interval.
    """

    kind: Literal["integer", "real"]
    left: float | None
    right: float | None
    closed: Closed = "both"

    def __contains__(self, value: object) -> bool:
        if not (is_int(value) if self.kind == "integer" else is_real(value)):
            return False
        number: Any = value
        if self.left is not None:
            if number < self.left or (number == self.left and self.closed not in ("left", "both")):
                return False
        if self.right is not None:
            if number > self.right or (number == self.right and self.closed not in ("right", "both")):
                return False
        return True

    def __str__(self) -> str:
        noun = "an integer" if self.kind == "integer" else "a number"
        left_in = self.closed in ("left", "both")
        right_in = self.closed in ("right", "both")
        if self.right is None:
            return noun if self.left is None else f"{noun} {'>=' if left_in else '>'} {self.left}"
        if self.left is None:
            return f"{noun} {'<=' if right_in else '<'} {self.right}"
        if self.kind == "integer" and left_in and right_in:
            return f"{noun} between {self.left} and {self.right}"
        return f"{noun} in {'[' if left_in else '('}{self.left}, {self.right}{']' if right_in else ')'}"


@dataclass(frozen=True)
class Options(_Rule):
    """One of a fixed set of strings."""

    values: tuple[str, ...]

    def __contains__(self, value: object) -> bool:
        return isinstance(value, str) and value in self.values

    def __str__(self) -> str:
        return f"one of {', '.join(self.values)}"


@dataclass(frozen=True)
class Amount:
    """How much of a split to read: a count of rows, a fraction of them, or a word (``auto``, ``all``).

    An integer is judged as a count when there is a ``count`` interval, any other number as a
    fraction, so the message names the part the value was meant for ("`signature_samples` must be
    an integer >= 2, got 1"); a value of no kind accepted gets ``text``, the whole rule in words.

    Parameters
    ----------
    fraction : Interval
        The fractions accepted (real).
    words : tuple of str
        The words accepted.
    text : str
        The whole rule in words, e.g. "a number in (0.0, 1.0] or 'auto'".
    count : Interval or None
        The counts accepted (integer); None when integers are fractions too (``1`` is every row).
    """

    fraction: Interval
    words: tuple[str, ...]
    text: str
    count: Interval | None = None

    def _part(self, value: object) -> Interval | None:
        if self.count is not None and is_int(value):
            return self.count
        return self.fraction if is_real(value) else None

    def __contains__(self, value: object) -> bool:
        part = self._part(value)
        return value in part if part is not None else isinstance(value, str) and value in self.words

    def describe(self, value: object) -> str:
        """The part of the rule ``value`` was meant for, or the whole rule."""
        part = self._part(value)
        return str(part) if part is not None else self.text

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class OffOr(_Rule):
    """``0``, which turns a feature off, or an integer in ``interval`` ("0 (off) or an integer between 2 and 20").

    A refused value gets the whole rule: one that misses the interval may have meant 0.
    """

    interval: Interval

    def __contains__(self, value: object) -> bool:
        return (is_int(value) and value == 0) or value in self.interval

    def __str__(self) -> str:
        return f"0 (off) or {self.interval}"


@dataclass(frozen=True)
class TupleOf(_Rule):
    """A non-empty tuple (or list) whose items all lie in ``item``.

    ``text`` is the rule in words, e.g. "a non-empty tuple of integers between 1 and 10".
    """

    item: Interval
    text: str

    def __contains__(self, value: object) -> bool:
        return isinstance(value, tuple | list) and len(value) > 0 and all(v in self.item for v in value)

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class SubsetOf(_Rule):
    """A non-empty tuple (or list) of distinct names, each one of ``values`` ("cahp,salience")."""

    values: tuple[str, ...]

    def __contains__(self, value: object) -> bool:
        return (isinstance(value, tuple | list) and len(value) > 0 and len(set(value)) == len(value)
                and all(isinstance(v, str) and v in self.values for v in value))

    def __str__(self) -> str:
        return f"a non-empty list of distinct names from {', '.join(self.values)}"


@dataclass(frozen=True)
class Device(_Rule):
    """A device name the engine accepts, spelled as :func:`parse_device` reads it."""

    def __contains__(self, value: object) -> bool:
        try:
            parse_device(value)
        except ConfigError:
            return False
        return True

    def __str__(self) -> str:
        return DEVICE_NAMES


class Constraint(Protocol):
    """What :func:`check` needs of a rule: membership, and the words for what a value must be."""

    def __contains__(self, value: object) -> bool: ...

    def describe(self, value: object) -> str: ...


def check(name: str, value: Any, constraint: Constraint, *, allow_none: bool = False) -> None:
    """Raise :class:`ConfigError` unless ``value`` satisfies ``constraint`` (or is None, when allowed)."""
    if value is None and allow_none:
        return
    if value not in constraint:
        raise ConfigError(f"`{name}` must be {constraint.describe(value)}, got {value!r}")


POSITIVE_INT = Interval("integer", 1, None, closed="left")


def check_positive_int(name: str, value: Any) -> None:
    """Raise :class:`ConfigError` ("`name` must be an integer >= 1, got ...") unless ``value`` is one."""
    check(name, value, POSITIVE_INT)


def parse_device(text: Any) -> str:
    """Return ``text`` if it names a device the engine accepts: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.

    Only the spelling is checked here (no torch import); whether this machine has that device is
    checked when the run starts.

    Raises
    ------
    ConfigError
        "`device` must be auto, cpu, cuda or cuda:N, got 'tpu'".
    """
    if isinstance(text, str):
        prefix, colon, index = text.partition(":")
        if text in ("auto", "cpu", "cuda") or (prefix == "cuda" and colon and index.isdigit()):
            return text
    raise ConfigError(f"`device` must be {DEVICE_NAMES}, got {text!r}")


def is_plain_file_name(name: Any) -> TypeGuard[str]:
    """Whether ``name`` names a file in a directory and nothing else: no separator, not ``.`` or ``..``.

    The rule for names a file lists for a loader to open beside it (a safetensors index's shards, a
    ``save_to_disk`` split's Arrow files and split directories): joined to their directory, such a
    name cannot lead anywhere else.
    """
    return isinstance(name, str) and name not in ("", ".", "..") and not any(c in name for c in "/\\\x00")


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """``"; did you mean X?"`` (or ``X or Y``) for the names in ``known`` nearest to ``word``; "" when none is near.

    Underscores and dashes count as the same character, as do upper and lower case (``--poly_degree``
    is ``--poly-degree`` misspelt), so each surface can append it to its "unknown name" message.
    """
    import difflib

    folded = {name.replace("_", "-").lower(): name for name in sorted(set(known))}
    target = word.replace("_", "-").lower()
    if target in folded and folded[target] != word:
        return f"; did you mean {folded[target]}?"
    close = difflib.get_close_matches(target, list(folded), n=2, cutoff=0.7)
    return "; did you mean " + " or ".join(folded[c] for c in close) + "?" if close else ""


#: Longest excerpt of a file's own text quoted in a message.
QUOTED = 80


def excerpt(value: Any, limit: int = QUOTED) -> str:
    """``repr(value)`` cut to about ``limit`` characters, for quoting untrusted input in a message."""
    text = repr(value) if not isinstance(value, str) else repr(value[: limit + 1])
    return text if len(text) <= limit else text[:limit] + "..."
