"""The inspection child: ``python -m app.core.sandbox._child MEMORY_BYTES OUTPUT_BYTES``.

It limits its own address space first (``RLIMIT_AS``, so no parser it runs can take more), then
answers tasks one at a time over its standard input and output, each frame an 8-byte little-endian
length and the bytes. Both ways are JSON: a task (its name, its arguments, the deployment's
settings, its CPU budget) and the answer (plain data only, at most ``OUTPUT_BYTES``), so nothing the
child computes from a hostile file can be more than a bounded summary, nor run code in the API when
it is read. Before each task the CPU
limit (``RLIMIT_CPU``) is moved to the seconds already used plus the task's budget: past it the
kernel ends the child with ``SIGXCPU``, which the pool reports as the CPU limit.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import sys
from typing import Any

from app.core.sandbox._frames import frame, read_frame

#: Longest error message sent back (a message may quote the input; this is the last bound on it).
MAX_MESSAGE = 2000


def _cpu_budget(seconds: int) -> None:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = int(usage.ru_utime + usage.ru_stime) + 1
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = used + seconds if hard == resource.RLIM_INFINITY else min(used + seconds, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _answer(task: str, settings: dict[str, Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    from app.core.sandbox._tasks import TASKS
    from app.core.settings import Settings

    try:
        return {"ok": TASKS[task](settings=Settings(**settings), **kwargs)}
    except MemoryError:
        return {"limit": "memory"}
    except OSError as exc:  # a library that could not map or allocate memory says so with ENOMEM
        if exc.errno == errno.ENOMEM or "memory" in str(exc).lower():
            return {"limit": "memory"}
        return _error(exc)
    except RecursionError:
        return {"limit": "nesting"}
    except Exception as exc:  # every other failure goes back as plain data, its message cut short
        if isinstance(exc, ImportError) and "memory" in str(exc).lower():
            return {"limit": "memory"}  # a library's shared objects could not be mapped under the limit
        return _error(exc)


def _error(exc: BaseException) -> dict[str, Any]:
    kind = type(exc)
    return {"error": {"module": kind.__module__, "name": kind.__qualname__, "message": str(exc)[:MAX_MESSAGE]}}


def main(argv: list[str]) -> int:
    memory, output = int(argv[1]), int(argv[2])
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    requests = sys.stdin.buffer
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # a stray print never corrupts the channel
    while (request := read_frame(requests)) is not None:
        asked = json.loads(request)
        _cpu_budget(int(asked["cpu_s"]))
        try:
            answer = _answer(asked["task"], asked["settings"], asked["kwargs"])
            data = json.dumps(answer, separators=(",", ":")).encode()
        except (TypeError, ValueError, MemoryError, RecursionError):
            data = json.dumps({"limit": "output", "size": -1}).encode()
        if len(data) > output:
            data = json.dumps({"limit": "output", "size": len(data)}).encode()
        answers.write(frame(data))
        answers.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
