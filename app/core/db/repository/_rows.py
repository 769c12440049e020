"""What the modules of the repository share."""

from __future__ import annotations

from typing import Any


def rowcount(result: Any) -> int:
    """Rows an ``UPDATE`` or ``DELETE`` matched: 1 means a conditional transition happened."""
    return int(getattr(result, "rowcount", 0))
