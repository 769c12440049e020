"""``cahp register JOB``: register a finished job's model in the server's MLflow model registry.

A client command like those of :mod:`app.cli.client_commands` (``CAHP_URL``, ``CAHP_API_KEY``): the
server logs the job's run and adds a version of the named model; it prints ``models:/<name>/<version>``.
The tracking server and its credentials are the server operator's, never the caller's.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from app.cli.client_commands import DEFAULT_TIMEOUT_S, DEFAULT_URL, _client, _pairs
from app.cli.exit_codes import fail
from app.cli.output import print_json
from app.cli.parser import shared_flags


def register(sub: Any) -> None:
    """Add ``register`` to ``sub`` (an argparse subparsers object)."""
    flags = shared_flags()
    flags.add_argument("--url", default=os.environ.get("CAHP_URL", DEFAULT_URL),
                       help="server URL (default: CAHP_URL, else %(default)s)")
    flags.add_argument("--api-key", default=os.environ.get("CAHP_API_KEY"), help="default: CAHP_API_KEY")
    flags.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                       help="keep trying an unreachable or busy server this many seconds (default %(default)s)")
    cmd = sub.add_parser("register", parents=[flags],
                         help="register a job's pruned model in the server's MLflow registry; prints its models:/ URI")
    cmd.add_argument("job", help="the job id")
    cmd.add_argument("--model-name", help="the registered model (default: the job's own `register`)")
    cmd.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE",
                     help="a tag of the new version, beside cahp's own (repeatable)")
    cmd.add_argument("--description", help="the new version's description")
    cmd.add_argument("--json", action="store_true", help="print the registration as JSON")
    cmd.set_defaults(func=cmd_register)


def cmd_register(args: argparse.Namespace) -> int:
    try:
        tags = _pairs(args.tag, "--tag")
    except ValueError as exc:
        return fail(str(exc))
    spec: dict[str, Any] | None = None
    if args.model_name:
        spec = {"model_name": args.model_name, "tags": tags}
        if args.description:
            spec["description"] = args.description
    elif tags or args.description:
        return fail("--tag and --description need --model-name (without any of them, the job's own `register` "
                    "settings are used)")
    with _client(args) as client:
        registration = client.register(args.job, spec)
    if args.json:
        print_json(registration.raw)
    else:
        print(registration.model_uri)
        print(f"cahp: registered job {args.job} as version {registration.version} of {registration.model_name!r} "
              f"(run {registration.run_id}) at {registration.tracking_uri}", file=sys.stderr)
    return 0
