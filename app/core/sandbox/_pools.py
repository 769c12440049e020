"""One inspection pool per set of limits, made once per process and closed at exit."""

from __future__ import annotations

import atexit
import threading

from app.core.sandbox._pool import InspectionPool, Limits, environment_key
from app.core.settings import Settings

_pools: dict[tuple[Limits, int], InspectionPool] = {}
_lock = threading.Lock()


def limits_of(settings: Settings) -> Limits:
    """The inspection limits ``settings`` ask for."""
    return Limits(memory_bytes=settings.inspection_memory_bytes, cpu_s=settings.inspection_cpu_s,
                  wall_s=settings.inspection_wall_s, output_bytes=settings.inspection_output_bytes)


def inspection_pool(settings: Settings) -> InspectionPool:
    """The process's pool for these settings' limits (one per distinct set of limits, made once)."""
    key = (limits_of(settings), settings.inspection_workers)
    with _lock:
        pool = _pools.get(key)
        if pool is not None and pool.environment != environment_key():
            pool.close()  # children keep the environment they started with: start new ones
            pool = None
        if pool is None:
            pool = _pools[key] = InspectionPool(*key)
        return pool


@atexit.register
def _close_all() -> None:
    with _lock:
        pools = list(_pools.values())
    for pool in pools:
        pool.close()
