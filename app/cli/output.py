"""Printing results for people and for scripts."""

from __future__ import annotations

import json
from typing import Any


def print_json(data: Any) -> None:
    """Print ``data`` as indented, key-sorted JSON on stdout."""
    print(json.dumps(data, indent=2, sort_keys=True))
