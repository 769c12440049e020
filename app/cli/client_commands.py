"""Client commands: ``upload``, ``submit``, ``status``, ``wait``, ``download``.

They talk to a running service over HTTP (``CAHP_URL``, ``CAHP_API_KEY``) through
:mod:`app.client`, and import nothing else of the service and nothing of the engine: a CI loop
calls ``cahp status`` often, and it must start in a fraction of a second.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from app.cli.dataset_flags import add_dataset_flags
from app.cli.exit_codes import ExitCode, fail
from app.cli.output import print_json
from cahp_engine.dataset_options import DATASET_OPTION_FIELDS

DEFAULT_URL = "http://127.0.0.1:8000"


def register(sub: Any) -> None:
    """Add the client subcommands to ``sub`` (an argparse subparsers object)."""
    client = argparse.ArgumentParser(add_help=False)
    client.add_argument("--url", default=os.environ.get("CAHP_URL", DEFAULT_URL),
                        help="server URL (default: CAHP_URL, else %(default)s)")
    client.add_argument("--api-key", default=os.environ.get("CAHP_API_KEY"), help="default: CAHP_API_KEY")

    upload = sub.add_parser("upload", parents=[client], help="upload a file or directory; prints its upload:// URI")
    upload.add_argument("path")
    upload.add_argument("--json", action="store_true")
    upload.set_defaults(func=cmd_upload)

    submit = sub.add_parser("submit", parents=[client], help="submit a job; prints its id")
    submit.add_argument("--model", required=True, help="URI, or a local directory/archive to upload")
    submit.add_argument("--revision")
    submit.add_argument("--dataset", required=True, help="URI, or a local directory/archive/file to upload")
    submit.add_argument("--eval-dataset", help="the evaluation split file, when --dataset is a single file")
    add_dataset_flags(submit, with_defaults=False)
    submit.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                        help="a pruning setting, e.g. --param epochs=1 (repeatable; values are JSON)")
    submit.add_argument("--params-file", help="a JSON object of pruning settings")
    submit.add_argument("--idempotency-key", help="repeat-safe submission: the same key returns the same job")
    submit.add_argument("--json", action="store_true", help="print the whole job as JSON")
    submit.set_defaults(func=cmd_submit)

    status = sub.add_parser("status", parents=[client], help="print a job's status")
    status.add_argument("job")
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=cmd_status)

    wait = sub.add_parser("wait", parents=[client], help="wait for a job; exit 0 only if it succeeded")
    wait.add_argument("job")
    wait.add_argument("--timeout", type=float, default=None, help="give up after this many seconds (exit 4)")
    wait.add_argument("--interval", type=float, default=2.0, help="seconds between polls")
    wait.add_argument("--quiet", action="store_true", help="do not print status changes")
    wait.add_argument("--json", action="store_true", help="print the final job as JSON")
    wait.set_defaults(func=cmd_wait)

    download = sub.add_parser("download", parents=[client], help="download a job's artifacts, checking sha256")
    download.add_argument("job")
    download.add_argument("name", nargs="?", help="one artifact (default: all)")
    download.add_argument("-o", "--output", default=".", help="directory to write into")
    download.set_defaults(func=cmd_download)



def _client(args: argparse.Namespace) -> Any:
    from app.client import ApiClient

    return ApiClient(args.url, args.api_key)


def _reference(value: str, client: Any) -> str:
    """A URI as given, or an existing local path uploaded first (a directory is packed)."""
    if "://" in value:
        return value
    path = Path(value).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"{value!r} is neither a URI (hf://, file://, upload://, s3://) nor a local path")
    upload = client.upload(path)
    print(f"cahp: uploaded {path} as {upload['uri']}", file=sys.stderr)
    return str(upload["uri"])


def _param_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def cmd_submit(args: argparse.Namespace) -> int:
    params: dict[str, Any] = {}
    if args.params_file:
        params.update(json.loads(Path(args.params_file).read_text()))
    for item in args.param:
        name, sep, value = item.partition("=")
        if not sep:
            return fail(f"--param takes NAME=VALUE, got {item!r}")
        params[name.strip()] = _param_value(value)
    with _client(args) as client:
        dataset: dict[str, Any] = {"uri": _reference(args.dataset, client)}
        if args.eval_dataset:
            dataset["eval_uri"] = _reference(args.eval_dataset, client)
        for name in DATASET_OPTION_FIELDS:
            if getattr(args, name) is not None:
                dataset[name] = getattr(args, name)
        body = {"model": {"uri": _reference(args.model, client), "revision": args.revision},
                "dataset": dataset, "params": params}
        job = client.submit(body, idempotency_key=args.idempotency_key)
    if args.json:
        print_json(job)
    else:
        print(job["id"])
    return 0


def _describe(job: dict[str, Any]) -> str:
    text = f"{job['id']} {job['status']}"
    if job.get("stage"):
        text += f" {job['stage']} {100 * job['progress']:.0f}%"
    if job.get("error"):
        text += f": {job['error']['code']}: {job['error']['message']}"
    return text


def cmd_status(args: argparse.Namespace) -> int:
    with _client(args) as client:
        job = client.job(args.job)
    if args.json:
        print_json(job)
    else:
        print(_describe(job))
    return 0


def cmd_wait(args: argparse.Namespace) -> int:
    last: list[str] = []

    def show(job: dict[str, Any]) -> None:
        line = _describe(job)
        if not args.quiet and line not in last:
            print(line, file=sys.stderr)
            last[:] = [line]

    with _client(args) as client:
        try:
            job = client.wait(args.job, timeout=args.timeout, interval=args.interval, on_update=show)
        except TimeoutError as exc:
            return fail(str(exc), ExitCode.TIMEOUT)
    if args.json:
        print_json(job)
    if job["status"] == "succeeded":
        return 0
    error = job.get("error") or {"code": job["status"], "message": ""}
    message = f"job {job['id']} {job['status']}: {error['code']}: {error['message']}"
    return fail(message, ExitCode.CANCELLED if job["status"] == "cancelled" else ExitCode.FAILED)


def cmd_download(args: argparse.Namespace) -> int:
    out = Path(args.output)
    with _client(args) as client:
        manifest = client.artifacts(args.job)
        chosen = [a for a in manifest if args.name in (None, a["name"])]
        if not chosen:
            names = ", ".join(a["name"] for a in manifest) or "none yet"
            return fail(f"job {args.job} has no artifact {args.name or ''!r}; it has: {names}")
        for artifact in chosen:
            print(client.download(args.job, artifact, out))
    return 0


def cmd_upload(args: argparse.Namespace) -> int:
    with _client(args) as client:
        upload = client.upload(Path(args.path))
    if args.json:
        print_json(upload)
    else:
        print(upload["uri"])
    return 0


