"""Printing results for people and for scripts."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def print_json(data: Any) -> None:
    """Print ``data`` as indented, key-sorted JSON on stdout (read-only mappings, like a record's ``raw``, too)."""
    print(json.dumps(data, indent=2, sort_keys=True, default=_plain))


def _plain(value: object) -> object:
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"{type(value).__name__} is not JSON")
