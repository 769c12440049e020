"""The exit codes of every ``cahp`` command, in one place."""

from __future__ import annotations

import enum
import sys


class ExitCode(enum.IntEnum):
    """What a ``cahp`` command's exit status means.

    ``OK`` success; ``FAILED`` the job or the local run failed (or a checksum did not match);
    ``USAGE`` bad usage, bad input (the message says what to change) or a request the server refused
    (4xx); ``CANCELLED`` the job was cancelled; ``TIMEOUT`` ``wait`` gave up; ``UNAVAILABLE`` the
    server could not be reached or failed (5xx); ``INTERRUPTED`` Ctrl-C.
    """

    OK = 0
    FAILED = 1
    USAGE = 2
    CANCELLED = 3
    TIMEOUT = 4
    UNAVAILABLE = 5
    INTERRUPTED = 130


def fail(message: str, code: ExitCode = ExitCode.USAGE) -> ExitCode:
    """Print ``cahp: message`` on stderr and return ``code``."""
    print(f"cahp: {message}", file=sys.stderr)
    return code
