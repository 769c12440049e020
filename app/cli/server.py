"""Server-side commands: ``serve``, ``worker``, ``db upgrade``, ``keys create|list|revoke``.

They read the ``CAHP_*`` settings (:mod:`app.core.settings`). Heavy imports (the API, Celery, the
database) happen inside each command, so that the parser, and the client commands, stay cheap.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from app.cli.exit_codes import fail
from app.cli.output import print_json

LOG_LEVELS = ["critical", "error", "warning", "info", "debug"]


def register(sub: Any) -> None:
    """Add the server-side subcommands to ``sub`` (an argparse subparsers object)."""
    serve = sub.add_parser("serve", help="run the API (and, in embedded mode, a worker)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default %(default)s)")
    serve.add_argument("--port", type=int, default=8000, help="port to listen on (default %(default)s)")
    serve.add_argument("--no-auth", action="store_true", help="accept requests without an API key (loopback only)")
    serve.add_argument("--workers", type=int, default=None,
                       help="local worker processes to start (default: 1 with the embedded broker, else 0)")
    serve.add_argument("--log-level", default="info", choices=LOG_LEVELS, help="log verbosity (default %(default)s)")
    serve.set_defaults(func=cmd_serve)

    worker = sub.add_parser("worker", help="run a worker that takes jobs from the broker")
    worker.add_argument("--device", help="cpu, cuda or cuda:N (default: CAHP_DEVICE, else auto)")
    worker.add_argument("--queue", help="queue to consume (default: CAHP_QUEUE, else cahp)")
    worker.add_argument("--pool", default="prefork", choices=["prefork", "solo", "threads"],
                        help="Celery pool: prefork runs each job in a child process (default %(default)s)")
    worker.add_argument("--concurrency", type=int, default=1, help="jobs at once; keep 1 per GPU")
    worker.add_argument("--name", help="Celery node name, e.g. gpu0@%%h (default: a random cahp-XXXXXX@host)")
    worker.add_argument("--log-level", default="info", choices=LOG_LEVELS, help="log verbosity (default %(default)s)")
    worker.add_argument("--metrics-port", type=int, default=None,
                        help="serve Prometheus metrics on this port (default: CAHP_WORKER_METRICS_PORT, else none)")
    worker.set_defaults(func=cmd_worker)

    db = sub.add_parser("db", help="database administration")
    db_sub = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    db_sub.add_parser("upgrade", help="apply the schema migrations").set_defaults(func=cmd_db_upgrade)

    keys = sub.add_parser("keys", help="API keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    create = keys_sub.add_parser("create", help="create a key and print it (only once)")
    create.add_argument("--name", required=True, help="what the key is for, e.g. ci or alice")
    create.set_defaults(func=cmd_keys_create)
    listing = keys_sub.add_parser("list", help="list keys: id, name, created, last used, revoked (never the key)")
    listing.add_argument("--json", action="store_true", help="print the keys as JSON")
    listing.set_defaults(func=cmd_keys_list)
    revoke = keys_sub.add_parser("revoke", help="revoke a key by id, or by name when one live key has it")
    revoke.add_argument("key", metavar="NAME_OR_ID", help="the key's id, or its name when one live key has it")
    revoke.set_defaults(func=cmd_keys_revoke)



def _settings(**env: str | None) -> Any:
    """Settings after applying command-line flags as ``CAHP_*`` variables (children inherit them)."""
    from app.core.settings import get_settings

    for name, value in env.items():
        if value is not None:
            os.environ[f"CAHP_{name.upper()}"] = value
    get_settings.cache_clear()
    return get_settings()


def _upgrade(settings: Any) -> None:
    from app.core.db import make_engine, upgrade_database

    engine = make_engine(settings.resolved_database_url)
    try:
        upgrade_database(engine)
    finally:
        engine.dispose()


def cmd_serve(args: argparse.Namespace) -> int:
    from app.core.settings import is_loopback

    settings = _settings(no_auth="true" if args.no_auth else None)
    if settings.no_auth and not is_loopback(args.host):
        return fail(f"--no-auth is accepted only on a loopback address (127.0.0.1, ::1), not {args.host!r}")
    from app.core.metrics_dir import use_directory

    # Before anything imports prometheus_client: this server and the workers it starts share it.
    use_directory(settings.data_dir / "metrics" / f"serve-{args.port}")
    import uvicorn

    from app.api.main import create_app
    from app.core.errors import OutboundUrlRefusedError

    _upgrade(settings)
    try:
        app = create_app(settings)
    except OutboundUrlRefusedError as exc:
        return fail(str(exc))
    workers = args.workers if args.workers is not None else (1 if settings.embedded_broker else 0)
    mode = "embedded (SQLite broker under CAHP_DATA_DIR)" if settings.embedded_broker else "team (external broker)"
    print(f"cahp: serving http://{args.host}:{args.port} in {mode} mode with {workers} local worker(s); "
          f"data in {settings.data_dir}", file=sys.stderr)
    # uvicorn re-raises the SIGTERM it caught once it has shut down; turned into SystemExit here, it
    # unwinds through the `finally` below instead of killing the process with its workers still running.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    _stop_stale_workers(settings)
    from app.cli.supervisor import WorkerSupervisor

    # A worker that exits (stopped, crashed, killed) is replaced; /readyz and /metrics ask how many live.
    supervisor = WorkerSupervisor(lambda: _start_worker(settings), workers, pid_file=_pid_file(settings),
                                  stop_worker=_stop).start()
    if workers:
        app.state.local_workers = supervisor

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            app.state.draining.set()  # open event streams end now; their clients reconnect elsewhere
            super().handle_exit(sig, frame)

    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            timeout_graceful_shutdown=10)
    try:
        Server(config).run()
    finally:
        supervisor.stop()
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

    settings = _settings(device=args.device, queue=args.queue,
                         worker_metrics_port=None if args.metrics_port is None else str(args.metrics_port))
    if settings.worker_metrics_port is not None:
        from app.core.metrics_dir import use_directory

        # Before prometheus_client is imported: the Celery pool processes write here, the server reads.
        use_directory(settings.resolved_work_dir / "metrics" / f"worker-{os.getpid()}")
    from app.core.errors import OutboundUrlRefusedError
    from app.core.storage import open_store
    from worker.celery_app import make_celery

    try:
        open_store(settings)  # an artifact store the worker may not reach is refused before any job is taken
    except OutboundUrlRefusedError as exc:
        return fail(str(exc))

    from worker.lifecycle import follow_parent_from_environment

    follow_parent_from_environment()  # started by `cahp serve`: exit with it
    if settings.worker_metrics_port is not None:
        from app.core.metrics import serve as serve_metrics

        serve_metrics(settings.worker_metrics_port)
        print(f"cahp: worker metrics on port {settings.worker_metrics_port} (/metrics)", file=sys.stderr)
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
    from app.core.db import make_engine, make_session_factory
    from app.core.errors import InvalidRequestError
    from app.core.security import create_api_key

    settings = _settings()
    _upgrade(settings)
    engine = make_engine(settings.resolved_database_url)
    try:
        with make_session_factory(engine)() as session:
            key = create_api_key(session=session, name=args.name)
    except InvalidRequestError as exc:
        return fail(str(exc))
    finally:
        engine.dispose()
    print(key)
    return 0


def _with_session(action: Any) -> Any:
    """Run ``action(session)`` against the configured database (migrated first)."""
    from app.core.db import make_engine, make_session_factory

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
    from app.core.security import list_keys

    keys = _with_session(lambda session: list_keys(session=session))
    if args.json:
        print_json([{"id": k.id, "name": k.name, "created_at": _when(k.created_at),
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
    from app.core.errors import InvalidRequestError, ResourceNotFoundError
    from app.core.security import revoke_key

    try:
        key = _with_session(lambda session: revoke_key(session=session, name_or_id=args.key))
    except (InvalidRequestError, ResourceNotFoundError) as exc:
        return fail(str(exc))
    print(f"cahp: key {key.id} ({key.name}) revoked at {_when(key.revoked_at)}; requests with it get 401 "
          "within CAHP_KEY_CACHE_S (1 s by default) and its signed links stop working; "
          f"{key.jobs_cancelled} queued job(s) cancelled, {key.jobs_stopping} running job(s) asked to stop",
          file=sys.stderr)
    return 0


