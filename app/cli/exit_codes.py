"""The exit codes of every ``cahp`` command, and which exception ends a command with which, in one place."""

from __future__ import annotations

import enum
import functools
import json
import sys


class ExitCode(enum.IntEnum):
    """What a ``cahp`` command's exit status means.

    ``OK`` success; ``FAILED`` the job or the local run failed (or a checksum did not match);
    ``USAGE`` bad usage, bad input (the message says what to change) or a request the server refused
    (4xx); ``CANCELLED`` the job was cancelled; ``TIMEOUT`` ``wait`` gave up; ``UNAVAILABLE`` the
    server could not be reached or failed (5xx); ``WARNINGS`` the job succeeded with a warning that
    ``wait --fail-on-warnings`` or ``--fail-on`` named; ``INTERRUPTED`` Ctrl-C.
    """

    OK = 0
    FAILED = 1
    USAGE = 2
    CANCELLED = 3
    TIMEOUT = 4
    UNAVAILABLE = 5
    WARNINGS = 6
    INTERRUPTED = 130


def fail(message: str, code: ExitCode = ExitCode.USAGE) -> ExitCode:
    """Print ``cahp: message`` on stderr and return ``code``."""
    print(f"cahp: {message}", file=sys.stderr)
    return code


def exit_code_for(exc: Exception) -> ExitCode | None:
    """The code a command that raised ``exc`` exits with (its message printed); None: not expected, a bug.

    By class, the first row of :func:`_exit_codes` that ``exc`` is an instance of.
    """
    return next((code for kind, code in _exit_codes() if isinstance(exc, kind)), None)


@functools.cache
def _exit_codes() -> tuple[tuple[type[Exception], ExitCode], ...]:
    # Imported here: the commands that never talk to a server (prune, export, serve) need no HTTP client.
    from app.client import (
        ChecksumError,
        InvalidResponseError,
        ProblemError,
        ServerError,
        TransportError,
        WaitTimeoutError,
    )

    return (
        (ChecksumError, ExitCode.FAILED),  # a download that does not match the manifest
        (WaitTimeoutError, ExitCode.TIMEOUT),  # `wait` gave up while the job went on
        (TransportError, ExitCode.UNAVAILABLE),  # no answer, for as long as --timeout allowed
        (InvalidResponseError, ExitCode.UNAVAILABLE),  # an answer that cannot be read
        (ServerError, ExitCode.UNAVAILABLE),  # 5xx
        (ProblemError, ExitCode.USAGE),  # every other problem is a 4xx: the request must change
        (FileNotFoundError, ExitCode.USAGE),  # a local path given on the command line
        (json.JSONDecodeError, ExitCode.USAGE),  # --params-file, and the like
    )
