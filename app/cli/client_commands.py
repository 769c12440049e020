"""Client commands: ``upload``, ``submit``, ``status``, ``wait``, ``download``, ``jobs``, ``delete``.

They talk to a running service over HTTP (``CAHP_URL``, ``CAHP_API_KEY``) through
:mod:`app.client`, and import nothing else of the service and nothing of the engine: a CI loop
calls ``cahp status`` often, and it must start in a fraction of a second. They print from the
client's records; ``--json`` prints the server's answer as it came (``raw``), every field included.
What an error exits with is decided by its class (:func:`app.cli.exit_codes.exit_code_for`).

Every command retries connection errors and 429/502/503/504 answers (honouring ``Retry-After``) for
up to ``--timeout`` seconds (30 by default); ``wait`` waits for the job as long as ``--timeout``
says (by default until it ends) and rides out server outages of up to five minutes each.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.cli.dataset_flags import add_dataset_flags
from app.cli.exit_codes import ExitCode, fail
from app.cli.output import print_json
from app.cli.parser import shared_flags
from cahp_engine.data import DATASET_OPTION_FIELDS

if TYPE_CHECKING:  # the client is imported when a command runs, not when the parser is built
    from collections.abc import Sequence

    from app.client import ApiClient, CheckReport, JobSnapshot, LogEntry

DEFAULT_URL = "http://127.0.0.1:8000"
#: How long a client command keeps trying an unreachable or busy server (``--timeout``).
DEFAULT_TIMEOUT_S = 30.0


def register(sub: Any) -> None:
    """Add the client subcommands to ``sub`` (an argparse subparsers object)."""
    client = shared_flags()
    client.add_argument("--url", default=os.environ.get("CAHP_URL", DEFAULT_URL),
                        help="server URL (default: CAHP_URL, else %(default)s)")
    client.add_argument("--api-key", default=os.environ.get("CAHP_API_KEY"), help="default: CAHP_API_KEY")

    timed = shared_flags()
    timed.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                       help="keep trying an unreachable or busy server this many seconds (default %(default)s)")

    upload = sub.add_parser("upload", parents=[client, timed],
                            help="upload a file or directory; prints its upload:// URI")
    upload.add_argument("path", help="a dataset split file, an archive, or a directory (packed as .tar.gz)")
    upload.add_argument("--json", action="store_true", help="print the whole upload record as JSON")
    upload.set_defaults(func=cmd_upload)

    submit = sub.add_parser("submit", parents=[client, timed], help="submit a job; prints its id")
    submit.add_argument("--model", required=True, help="URI, or a local directory/archive to upload")
    submit.add_argument("--revision", help="hub revision (branch, tag or commit) of an hf:// model")
    submit.add_argument("--dataset", required=True, help="URI, or a local directory/archive/file to upload")
    submit.add_argument("--eval-dataset", help="the evaluation split file, when --dataset is a single file")
    add_dataset_flags(submit, with_defaults=False)
    submit.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                        help="a pruning setting, e.g. --param epochs=1 (repeatable; values are JSON)")
    submit.add_argument("--params-file", help="a JSON object of pruning settings")
    submit.add_argument("--idempotency-key",
                        help="repeat-safe submission: the same key returns the same job (default: a new random "
                        "key, so retries within this command never make two jobs; pass e.g. $CI_PIPELINE_ID to "
                        "make re-runs of the step safe too)")
    submit.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                        help="a label, e.g. --label git/commit=$CI_COMMIT_SHA (repeatable)")
    submit.add_argument("--notify-url", help="also POST this job's events here (Standard Webhooks, signed)")
    submit.add_argument("--name", help="what to call the pruned model (its cards' title, the console's name)")
    submit.add_argument("--register", metavar="MODEL_NAME",
                        help="also register the pruned model in the server's MLflow registry under this name")
    submit.add_argument("--json", action="store_true", help="print the whole job as JSON")
    submit.add_argument("--check", action="store_true",
                        help="only check the job as a submit would (model, dataset, settings), queue nothing: "
                        "exit 0 and say what was checked, or exit 2 with what to change")
    submit.set_defaults(func=cmd_submit)

    status = sub.add_parser("status", parents=[client, timed], help="print a job's status")
    status.add_argument("job", help="the job id")
    status.add_argument("--json", action="store_true", help="print the whole job as JSON")
    status.set_defaults(func=cmd_status)

    wait = sub.add_parser("wait", parents=[client], help="wait for a job; exit 0 only if it succeeded")
    wait.add_argument("job", help="the job id")
    wait.add_argument("--timeout", type=float, default=None, help="give up after this many seconds (exit 4)")
    wait.add_argument("--interval", type=float, default=2.0, help="seconds between polls")
    wait.add_argument("--quiet", action="store_true", help="do not print status changes")
    wait.add_argument("--follow", action="store_true",
                      help="print the job's log as it is written (from its event stream) while waiting")
    wait.add_argument("--json", action="store_true", help="print the final job as JSON")
    gate = wait.add_mutually_exclusive_group()
    gate.add_argument("--fail-on-warnings", action="store_true",
                      help="exit 6 when the job succeeded with any warning (a CI gate on a bad model)")
    gate.add_argument("--fail-on", metavar="CODES", type=_warning_codes,
                      help="exit 6 when the job succeeded with a warning of one of these codes, comma-separated "
                           "(class_lost, near_chance, accuracy_drop, macro_f1_drop, int8_accuracy_drop, recall_drop, "
                           "untrained_head, no_knee, no_stability, budget_noise, validation_seen, target_missed, "
                           "other)")
    wait.set_defaults(func=cmd_wait)

    download = sub.add_parser("download", parents=[client, timed],
                              help="download a job's artifacts, resuming broken transfers, checking sha256")
    download.add_argument("job", help="the job id")
    download.add_argument("name", nargs="?", help="one artifact (default: all)")
    download.add_argument("-o", "--output", default=".", help="directory to write into")
    download.set_defaults(func=cmd_download)

    jobs = sub.add_parser("jobs", parents=[client, timed], help="list jobs, newest first")
    jobs.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="only jobs with this label")
    jobs.add_argument("--status", choices=["queued", "running", "succeeded", "failed", "cancelled"],
                      help="only jobs with this status")
    jobs.add_argument("--limit", type=int, default=20, help="at most this many jobs (default %(default)s)")
    jobs.add_argument("--json", action="store_true", help="print the jobs as JSON")
    jobs.set_defaults(func=cmd_jobs)

    delete = sub.add_parser("delete", parents=[client, timed],
                            help="delete a finished job with its log and artifacts")
    delete.add_argument("job", help="the job id")
    delete.set_defaults(func=cmd_delete)


def _client(args: argparse.Namespace, *, timeout: float | None = None) -> ApiClient:
    from app.client import ApiClient

    def say(message: str) -> None:
        print(f"cahp: {message}", file=sys.stderr)

    return ApiClient(args.url, args.api_key, timeout=getattr(args, "timeout", timeout), on_retry=say)


def _pairs(items: list[str], flag: str) -> dict[str, str]:
    found = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{flag} takes KEY=VALUE, got {item!r}")
        found[key] = value
    return found


def _reference(value: str, client: ApiClient) -> str:
    """A URI as given, or an existing local path uploaded first (a directory is packed)."""
    if "://" in value:
        return value
    path = Path(value).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"{value!r} is neither a URI (hf://, file://, upload://, s3://) nor a local path")
    upload, sent = client.ensure_uploaded(path)
    done = "uploaded" if sent else "is already uploaded (same sha256); nothing sent"
    print(f"cahp: {path} {done} as {upload.uri}", file=sys.stderr)
    return upload.uri


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
    unknown = _unknown_param(params) or _invalid_param(params)
    if unknown:
        return fail(unknown)
    try:
        labels = _pairs(args.label, "--label")
    except ValueError as exc:
        return fail(str(exc))
    with _client(args) as client:
        dataset: dict[str, Any] = {"uri": _reference(args.dataset, client)}
        if args.eval_dataset:
            dataset["eval_uri"] = _reference(args.eval_dataset, client)
        for name in DATASET_OPTION_FIELDS:
            if getattr(args, name) is not None:
                dataset[name] = getattr(args, name)
        body: dict[str, Any] = {"model": {"uri": _reference(args.model, client), "revision": args.revision},
                                "dataset": dataset, "params": params}
        if labels:
            body["labels"] = labels
        if args.notify_url:
            body["notify_url"] = args.notify_url
        if args.name:
            body["name"] = args.name
        if args.register:
            body["register"] = {"model_name": args.register}
        if args.check:
            return _print_check(client.check(body), as_json=args.json)
        job = client.submit(body, idempotency_key=args.idempotency_key or f"cahp-{uuid.uuid4().hex}")
    if args.json:
        print_json(job.raw)
    else:
        print(job.id)
    return 0


def _print_check(check: CheckReport, *, as_json: bool) -> int:
    if as_json:
        print_json(check.raw)
        return 0
    for line in check.checked:
        print(f"checked {line}")
    for line in check.skipped:
        print(f"left to the worker: {line}")
    return 0


def _unknown_param(params: dict[str, Any]) -> str | None:
    """A message for the first setting name no job takes, with the nearest names; None when all are known.

    Checked before anything is uploaded; the server checks again (and says the same).
    """
    from cahp_engine.config import did_you_mean, settings_for

    known = [setting.name for setting in settings_for("api")]
    for name in params:
        if name not in known:
            return (f"--param {name}: no job setting has this name{did_you_mean(name, known)} "
                    "(`cahp prune --help` lists them, with --flag-names for name_with_underscores)")
    return None


def _invalid_param(params: dict[str, Any]) -> str | None:
    """The engine's message for a value no job takes (``epochs=one``), before anything is packed or uploaded."""
    from cahp_engine.config import PruningConfig
    from cahp_engine.errors import CahpError

    try:
        PruningConfig.from_dict({k: v for k, v in params.items() if v is not None})
    except (CahpError, ValueError, TypeError) as exc:
        return f"--param: {exc}"
    return None


def _describe(job: JobSnapshot, *, eta: bool = True) -> str:
    text = f"{job.id} {job.status}"
    if job.stage:
        text += f" {job.stage} {100 * job.progress:.0f}%"
    if eta and job.eta_s is not None and not job.finished:
        text += f", about {_duration(job.eta_s)} left"
    if job.error:
        text += f": {job.error.code}: {job.error.message}"
    return text


def _duration(seconds: float) -> str:
    """``42 s``, ``7 min``, ``2 h 05 min``: a remaining time to the precision it deserves."""
    if seconds < 90:
        return f"{max(0, round(seconds))} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 90 else f"{minutes // 60} h {minutes % 60:02d} min"


def cmd_status(args: argparse.Namespace) -> int:
    with _client(args) as client:
        job = client.job(args.job)
    if args.json:
        print_json(job.raw)
    else:
        print(_describe(job))
    return 0


def cmd_wait(args: argparse.Namespace) -> int:
    last: list[str] = []

    def show(job: JobSnapshot) -> None:
        # A new line when the status, stage or whole percent changes (with the time left then), not
        # at every new estimate.
        key = _describe(job, eta=False)
        if not args.quiet and key not in last:
            print(_describe(job), file=sys.stderr)
            last[:] = [key]

    def log(line: LogEntry) -> None:
        # The log is the output of `wait --follow`; with --json it goes to stderr, keeping stdout JSON.
        print(line.message, file=sys.stderr if args.json else sys.stdout, flush=True)

    # Giving up at --timeout raises WaitTimeoutError: ExitCode.TIMEOUT, by the table in exit_codes.
    with _client(args, timeout=None) as client:
        if args.follow:
            job = client.follow(args.job, timeout=args.timeout, on_job=show, on_log=log)
        else:
            job = client.wait(args.job, timeout=args.timeout, interval=args.interval, on_update=show)
    if args.json:
        print_json(job.raw)
    # Quality warnings (a class never predicted, macro-F1 near chance, too large a drop) are not missed in CI logs.
    warnings = (job.result.warnings if job.result is not None else None) or ()
    codes = (job.result.warning_codes if job.result is not None else None) or ()
    for i, warning in enumerate(warnings):
        code = f" [{codes[i]}]" if i < len(codes) else ""
        print(f"cahp: warning: job {job.id}{code}: {warning}", file=sys.stderr)
    if job.status == "succeeded":
        return _gate(job.id, warnings, codes, everything=args.fail_on_warnings, chosen=args.fail_on)
    code, detail = (job.error.code, job.error.message) if job.error else (job.status, "")
    message = f"job {job.id} {job.status}: {code}: {detail}"
    return fail(message, ExitCode.CANCELLED if job.status == "cancelled" else ExitCode.FAILED)


def _warning_codes(text: str) -> frozenset[str]:
    """``--fail-on``'s value: known warning codes, comma-separated (a misspelt one is refused with the nearest)."""
    import difflib

    from cahp_engine.run import WARNING_CODES

    codes = frozenset(c.strip() for c in text.split(",") if c.strip())
    for code in sorted(codes - set(WARNING_CODES)):
        near = difflib.get_close_matches(code, WARNING_CODES, n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise argparse.ArgumentTypeError(f"unknown warning code {code!r}{hint}; the codes are "
                                         + ", ".join(WARNING_CODES))
    if not codes:
        raise argparse.ArgumentTypeError("name at least one warning code, e.g. class_lost,near_chance")
    return codes


def _gate(job_id: str, warnings: Sequence[str], codes: Sequence[str], *, everything: bool,
          chosen: frozenset[str] | None) -> int:
    """0, or ExitCode.WARNINGS when a warning the caller fails on is there (a warning with no code counts as
    ``other``, as a server older than the codes sends)."""
    if not everything and not chosen:
        return 0
    coded = [(codes[i] if i < len(codes) else "other", w) for i, w in enumerate(warnings)]
    hits = [(c, w) for c, w in coded if everything or c in (chosen or ())]
    if not hits:
        return 0
    names = ", ".join(sorted({c for c, _ in hits}))
    return fail(f"job {job_id} succeeded with {len(hits)} warning(s) it was told to fail on ({names})",
                ExitCode.WARNINGS)


def cmd_download(args: argparse.Namespace) -> int:
    out = Path(args.output)
    with _client(args) as client:
        manifest = client.artifacts(args.job)
        chosen = [a for a in manifest if args.name in (None, a.name)]
        if not chosen:
            names = ", ".join(a.name for a in manifest) or "none yet"
            return fail(f"job {args.job} has no artifact {args.name or ''!r}; it has: {names}")
        for artifact in chosen:
            print(client.download(args.job, artifact, out))
    return 0


def cmd_upload(args: argparse.Namespace) -> int:
    with _client(args) as client:
        upload = client.upload(Path(args.path))
    if args.json:
        print_json(upload.raw)
    else:
        print(upload.uri)
    return 0


def cmd_jobs(args: argparse.Namespace) -> int:
    try:
        labels = _pairs(args.label, "--label")
    except ValueError as exc:
        return fail(str(exc))
    with _client(args) as client:
        found = client.jobs(labels=labels, status=args.status, limit=args.limit).data
    if args.json:
        print_json([job.raw for job in found])
    else:
        for job in found:
            tags = " ".join(f"{k}={v}" for k, v in sorted(job.labels.items()))
            print(f"{_describe(job)}{'  ' + tags if tags else ''}")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    with _client(args) as client:
        client.delete(args.job)
    print(f"cahp: job {args.job} deleted", file=sys.stderr)
    return 0

