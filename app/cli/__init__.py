"""The one ``cahp`` command.

Server side (read the ``CAHP_*`` settings; :mod:`app.cli.server`): ``serve``, ``worker``,
``db upgrade``, ``keys create|list|revoke``. Client side (read ``CAHP_URL`` and ``CAHP_API_KEY``;
:mod:`app.cli.client_commands`): ``upload``, ``submit``, ``status``, ``wait``, ``download``. Local
runs without the service: ``prune`` (:mod:`app.cli.prune`) and ``export`` (:mod:`app.cli.export`).

Exit codes are :class:`app.cli.exit_codes.ExitCode`. Building the parser imports neither the
engine's torch code nor the service: each command imports what it needs when it runs.
"""

from __future__ import annotations

import argparse
import json

from app.cli import client_commands, export, prune, server
from app.cli.exit_codes import ExitCode, fail

__all__ = ["ExitCode", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cahp", description="Complementary Attention Head Pruning")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    server.register(sub)
    client_commands.register(sub)
    prune.register(sub)
    export.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from app.client import ApiError, ChecksumError

    try:
        return int(args.func(args) or 0)
    except ApiError as exc:
        return fail(str(exc), ExitCode.UNAVAILABLE if exc.status == 0 or exc.status >= 500 else ExitCode.USAGE)
    except ChecksumError as exc:
        return fail(str(exc), ExitCode.FAILED)
    except (FileNotFoundError, json.JSONDecodeError) as exc:
        return fail(str(exc))
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
