"""What the machine a process runs on has: its memory, as the kernel limits this process to it."""

from __future__ import annotations

import os
from pathlib import Path


def machine_memory_bytes() -> int:
    """This machine's memory: its RAM, or the memory limit of its cgroup (v2 or v1) when that is lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < total:
            total = int(text)
    return int(total)
