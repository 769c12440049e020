"""Parameter checks shared by the engine, in scikit-learn's style, importable without torch or numpy.

A constraint is an :class:`Interval` (integer or real, each end open, closed or absent) or an
:class:`Options` set; :func:`check` raises :class:`~cahp_engine.errors.ConfigError` with the message
"`name` must be <constraint>, got <value>", e.g. "`poly_degree` must be an integer between 1 and 10,
got 0". Booleans are neither integers nor reals here, and a real must be finite.

References
----------
scikit-learn's ``sklearn.utils._param_validation`` (``Interval``, ``StrOptions``).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Literal, TypeGuard

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


@dataclass(frozen=True)
class Interval:
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
class Options:
    """One of a fixed set of strings."""

    values: tuple[str, ...]

    def __contains__(self, value: object) -> bool:
        return isinstance(value, str) and value in self.values

    def __str__(self) -> str:
        return f"one of {', '.join(self.values)}"


def check(name: str, value: Any, constraint: Interval | Options, *, allow_none: bool = False) -> None:
    """Raise :class:`ConfigError` unless ``value`` satisfies ``constraint`` (or is None, when allowed)."""
    if value is None and allow_none:
        return
    if value not in constraint:
        raise ConfigError(f"`{name}` must be {constraint}, got {value!r}")


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
