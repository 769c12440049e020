"""The ``cahp`` command: run the service, manage it, and use it from CI.

Server side (read the ``CAHP_*`` settings): ``serve``, ``worker``, ``db upgrade``, ``keys create|list|revoke``.
Client side (read ``CAHP_URL`` and ``CAHP_API_KEY``): ``upload``, ``submit``, ``status``, ``wait``,
``download``. The engine adds ``prune`` (a local run without the service).

Exit codes: 0 success; 1 the job failed; 2 bad usage or a request the server refused (4xx);
3 the job was cancelled; 4 ``wait`` timed out; 5 the server could not be reached or failed (5xx).
Imports are local to each command so client commands start fast.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

EXIT_FAILED, EXIT_USAGE, EXIT_CANCELLED, EXIT_TIMEOUT, EXIT_UNAVAILABLE = 1, 2, 3, 4, 5
DEFAULT_URL = "http://127.0.0.1:8000"


def _fail(message: str, code: int = EXIT_USAGE) -> int:
    print(f"cahp: {message}", file=sys.stderr)
    return code


# --- server side ------------------------------------------------------------------------------------


def _settings(**env: str | None) -> Any:
    """Settings after applying command-line flags as ``CAHP_*`` variables (children inherit them)."""
    from app.settings import get_settings

    for name, value in env.items():
        if value is not None:
            os.environ[f"CAHP_{name.upper()}"] = value
    get_settings.cache_clear()
    return get_settings()


def _upgrade(settings: Any) -> None:
    from app.db import make_engine, upgrade_database

    engine = make_engine(settings.resolved_database_url)
    try:
        upgrade_database(engine)
    finally:
        engine.dispose()


def cmd_serve(args: argparse.Namespace) -> int:
    from app.settings import is_loopback

    settings = _settings(no_auth="true" if args.no_auth else None)
    if settings.no_auth and not is_loopback(args.host):
        return _fail(f"--no-auth is accepted only on a loopback address (127.0.0.1, ::1), not {args.host!r}")
    import uvicorn

    from app.errors import OutboundUrlRefusedError
    from app.main import create_app

    _upgrade(settings)
    try:
        app = create_app(settings)
    except OutboundUrlRefusedError as exc:
        return _fail(str(exc))
    workers = args.workers if args.workers is not None else (1 if settings.embedded_broker else 0)
    mode = "embedded (SQLite broker under CAHP_DATA_DIR)" if settings.embedded_broker else "team (external broker)"
    print(f"cahp: serving http://{args.host}:{args.port} in {mode} mode with {workers} local worker(s); "
          f"data in {settings.data_dir}", file=sys.stderr)
    # uvicorn re-raises the SIGTERM it caught once it has shut down; turned into SystemExit here, it
    # unwinds through the `finally` below instead of killing the process with its workers still running.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    _stop_stale_workers(settings)
    children = [_start_worker(settings) for _ in range(workers)]
    if children:
        _pid_file(settings).write_text("".join(f"{child.pid}\n" for child in children))
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=10)
    finally:
        for child in children:
            _stop(child)
        if children:
            _pid_file(settings).unlink(missing_ok=True)
    return 0


def _exit_on_signal(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


def _start_worker(settings: Any) -> subprocess.Popen[bytes]:
    from worker.lifecycle import PARENT_PID_ENV, die_with_parent

    parent = os.getpid()
    env = {**os.environ, **settings.child_environment(), PARENT_PID_ENV: str(parent)}
    # The worker dies with this server, even on kill -9 (parent-death signal, and a watchdog inside).
    return subprocess.Popen([sys.executable, "-m", "app.cli", "worker"], env=env,
                            preexec_fn=lambda: die_with_parent(parent))


def _pid_file(settings: Any) -> Path:
    return Path(settings.data_dir) / "embedded-workers.pid"


def _stop_stale_workers(settings: Any) -> None:
    """Kill workers an earlier ``cahp serve`` on this data directory left running, then forget them.

    Only a process whose command line is still ``app.cli worker`` is touched (a recycled pid is not).
    """
    import time

    path = _pid_file(settings)
    try:
        pids = [int(p) for p in path.read_text().split() if p.isdigit()]
    except OSError:
        return
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"app.cli" in cmdline and b"worker" in cmdline:
            print(f"cahp: stopping worker {pid} left by an earlier server", file=sys.stderr)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            for _ in range(100):
                if not Path(f"/proc/{pid}").exists() or b"Z" in _proc_state(pid):
                    break
                time.sleep(0.05)
    path.unlink(missing_ok=True)


def _proc_state(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return b"Z"


def _stop(child: subprocess.Popen[bytes], grace_s: float = 30.0) -> None:
    if child.poll() is not None:
        return
    child.send_signal(signal.SIGTERM)  # Celery's warm shutdown: finish or give back the running job
    try:
        child.wait(grace_s)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def cmd_worker(args: argparse.Namespace) -> int:
    import uuid

    settings = _settings(device=args.device, queue=args.queue)
    from app.errors import OutboundUrlRefusedError
    from app.storage import open_store
    from worker.celery_app import make_celery

    try:
        open_store(settings)  # an artifact store the worker may not reach is refused before any job is taken
    except OutboundUrlRefusedError as exc:
        return _fail(str(exc))

    from worker.lifecycle import follow_parent_from_environment

    follow_parent_from_environment()  # started by `cahp serve`: exit with it
    celery = make_celery(settings, with_tasks=True)
    argv = ["worker", f"--pool={args.pool}", f"--concurrency={args.concurrency}", f"--queues={settings.queue}",
            f"--loglevel={args.log_level.upper()}", f"--hostname={args.name or f'cahp-{uuid.uuid4().hex[:6]}@%h'}",
            # No worker-to-worker chatter: jobs coordinate through the database, not through Celery.
            "--without-gossip", "--without-mingle", "--without-heartbeat"]
    celery.worker_main(argv)
    return 0


def cmd_db_upgrade(_args: argparse.Namespace) -> int:
    settings = _settings()
    _upgrade(settings)
    from sqlalchemy import make_url

    print(f"database {make_url(settings.resolved_database_url).render_as_string(hide_password=True)} is up to date",
          file=sys.stderr)
    return 0


def cmd_keys_create(args: argparse.Namespace) -> int:
    from app.db import make_engine, make_session_factory
    from app.errors import InvalidRequestError
    from app.services.keys import create_api_key

    settings = _settings()
    _upgrade(settings)
    engine = make_engine(settings.resolved_database_url)
    try:
        with make_session_factory(engine)() as session:
            key = create_api_key(session=session, name=args.name)
    except InvalidRequestError as exc:
        return _fail(str(exc))
    finally:
        engine.dispose()
    print(key)
    return 0


def _with_session(action: Any) -> Any:
    """Run ``action(session)`` against the configured database (migrated first)."""
    from app.db import make_engine, make_session_factory

    settings = _settings()
    _upgrade(settings)
    engine = make_engine(settings.resolved_database_url)
    try:
        with make_session_factory(engine)() as session:
            return action(session)
    finally:
        engine.dispose()


def _when(value: Any) -> str:
    return value.isoformat(timespec="seconds") if value is not None else "-"


def cmd_keys_list(args: argparse.Namespace) -> int:
    from app.services.keys import list_api_keys

    keys = _with_session(lambda session: list_api_keys(session=session))
    if args.json:
        _print([{"id": k.id, "name": k.name, "created_at": _when(k.created_at),
                 "last_used_at": None if k.last_used_at is None else _when(k.last_used_at),
                 "revoked_at": None if k.revoked_at is None else _when(k.revoked_at)} for k in keys])
        return 0
    rows = [("ID", "NAME", "CREATED", "LAST USED", "REVOKED")]
    rows += [(k.id, k.name, _when(k.created_at), _when(k.last_used_at), _when(k.revoked_at)) for k in keys]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    return 0


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    from app.errors import InvalidRequestError, NotFoundError
    from app.services.keys import revoke_api_key

    try:
        key = _with_session(lambda session: revoke_api_key(session=session, name_or_id=args.key))
    except (InvalidRequestError, NotFoundError) as exc:
        return _fail(str(exc))
    print(f"cahp: key {key.id} ({key.name}) revoked at {_when(key.revoked_at)}; requests with it now get 401",
          file=sys.stderr)
    return 0


# --- client side ------------------------------------------------------------------------------------


def _client(args: argparse.Namespace) -> Any:
    from app.client import ApiClient

    return ApiClient(args.url, args.api_key)


def _print(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True))


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
            return _fail(f"--param takes NAME=VALUE, got {item!r}")
        params[name.strip()] = _param_value(value)
    with _client(args) as client:
        dataset: dict[str, Any] = {"uri": _reference(args.dataset, client)}
        if args.eval_dataset:
            dataset["eval_uri"] = _reference(args.eval_dataset, client)
        for name in ("text_column", "text_pair_column", "label_column", "train_split", "eval_split"):
            if getattr(args, name) is not None:
                dataset[name] = getattr(args, name)
        body = {"model": {"uri": _reference(args.model, client), "revision": args.revision},
                "dataset": dataset, "params": params}
        job = client.submit(body, idempotency_key=args.idempotency_key)
    if args.json:
        _print(job)
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
        _print(job)
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
            return _fail(str(exc), EXIT_TIMEOUT)
    if args.json:
        _print(job)
    if job["status"] == "succeeded":
        return 0
    error = job.get("error") or {"code": job["status"], "message": ""}
    message = f"job {job['id']} {job['status']}: {error['code']}: {error['message']}"
    return _fail(message, EXIT_CANCELLED if job["status"] == "cancelled" else EXIT_FAILED)


def cmd_download(args: argparse.Namespace) -> int:
    out = Path(args.output)
    with _client(args) as client:
        manifest = client.artifacts(args.job)
        chosen = [a for a in manifest if args.name in (None, a["name"])]
        if not chosen:
            names = ", ".join(a["name"] for a in manifest) or "none yet"
            return _fail(f"job {args.job} has no artifact {args.name or ''!r}; it has: {names}")
        for artifact in chosen:
            print(client.download(args.job, artifact, out))
    return 0


def cmd_upload(args: argparse.Namespace) -> int:
    with _client(args) as client:
        upload = client.upload(Path(args.path))
    if args.json:
        _print(upload)
    else:
        print(upload["uri"])
    return 0


# --- the parser -------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cahp", description="Complementary Attention Head Pruning")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the API (and, in embedded mode, a worker)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--no-auth", action="store_true", help="accept requests without an API key (loopback only)")
    serve.add_argument("--workers", type=int, default=None,
                       help="local worker processes to start (default: 1 with the embedded broker, else 0)")
    serve.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    serve.set_defaults(func=cmd_serve)

    worker = sub.add_parser("worker", help="run a worker that takes jobs from the broker")
    worker.add_argument("--device", help="cpu, cuda or cuda:N (default: CAHP_DEVICE, else auto)")
    worker.add_argument("--queue", help="queue to consume (default: CAHP_QUEUE, else cahp)")
    worker.add_argument("--pool", default="prefork", choices=["prefork", "solo", "threads"])
    worker.add_argument("--concurrency", type=int, default=1, help="jobs at once; keep 1 per GPU")
    worker.add_argument("--name", help="Celery node name, e.g. gpu0@%%h (default: a random cahp-XXXXXX@host)")
    worker.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    worker.set_defaults(func=cmd_worker)

    db = sub.add_parser("db", help="database administration")
    db_sub = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    db_sub.add_parser("upgrade", help="apply the schema migrations").set_defaults(func=cmd_db_upgrade)

    keys = sub.add_parser("keys", help="API keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    create = keys_sub.add_parser("create", help="create a key and print it (only once)")
    create.add_argument("--name", required=True)
    create.set_defaults(func=cmd_keys_create)
    listing = keys_sub.add_parser("list", help="list keys: id, name, created, last used, revoked (never the key)")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=cmd_keys_list)
    revoke = keys_sub.add_parser("revoke", help="revoke a key by id, or by name when one live key has it")
    revoke.add_argument("key", metavar="NAME_OR_ID")
    revoke.set_defaults(func=cmd_keys_revoke)

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
    for name in ("text-column", "text-pair-column", "label-column", "train-split", "eval-split"):
        submit.add_argument(f"--{name}")
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

    try:
        from cahp_engine.cli import register as register_prune
    except ModuleNotFoundError as exc:  # only a missing module is tolerated, not a broken one
        if exc.name != "cahp_engine.cli":
            raise
    else:
        register_prune(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from app.client import ApiError, ChecksumError

    try:
        return int(args.func(args) or 0)
    except ApiError as exc:
        return _fail(str(exc), EXIT_UNAVAILABLE if exc.status == 0 or exc.status >= 500 else EXIT_USAGE)
    except ChecksumError as exc:
        return _fail(str(exc), EXIT_FAILED)
    except (FileNotFoundError, json.JSONDecodeError) as exc:
        return _fail(str(exc))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
