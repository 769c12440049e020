"""The one ``cahp`` command.

Server side (read the ``CAHP_*`` settings; :mod:`app.cli.server`): ``serve``, ``worker``,
``db upgrade``, ``keys create|list|revoke``. Client side (read ``CAHP_URL`` and ``CAHP_API_KEY``;
:mod:`app.cli.client_commands`): ``upload``, ``submit``, ``status``, ``wait``, ``download``, and
``register`` (:mod:`app.cli.registry_commands`). Local
runs without the service: ``prune`` (:mod:`app.cli.prune`) and ``export`` (:mod:`app.cli.export`).

Exit codes are :class:`app.cli.exit_codes.ExitCode`; an exception a command ends with is mapped to
one by its class (:func:`app.cli.exit_codes.exit_code_for`: a 4xx problem is ``USAGE``, no answer or
a 5xx ``UNAVAILABLE``, a bad checksum ``FAILED``, ``wait`` giving up ``TIMEOUT``). Building the
parser imports neither the engine's torch code nor the service: each command imports what it needs
when it runs.
"""

from __future__ import annotations

import argparse

from app.cli import client_commands, export, prune, registry_commands, server
from app.cli.exit_codes import ExitCode, exit_code_for, fail
from app.cli.parser import CahpParser

__all__ = ["ExitCode", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    # Subparsers are made with the class of their parent: every parser of the command is a CahpParser.
    parser = CahpParser(prog="cahp", description="Complementary Attention Head Pruning")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    server.register(sub)
    client_commands.register(sub)
    registry_commands.register(sub)
    prune.register(sub)
    export.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    except Exception as exc:
        code = exit_code_for(exc)
        if code is None:
            raise
        return fail(str(exc), code)
