"""The server-side `cahp` commands in-process, and the client commands' output and error exits."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import inspect

from app.cli import ExitCode, build_parser, main
from app.cli.exit_codes import exit_code_for
from app.client import (
    AuthError,
    BadRequestError,
    ChecksumError,
    InvalidResponseError,
    NotFoundError,
    RateLimitedError,
    ServerError,
    TransportError,
    WaitTimeoutError,
)
from app.core.db import make_engine, make_session_factory
from app.core.security import authenticate
from app.core.settings import get_settings
from tests.support.helpers import free_port


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CAHP_DATA_DIR", str(tmp_path / "cahp-data"))
    yield tmp_path / "cahp-data"
    get_settings.cache_clear()  # the commands read the settings from the environment


def test_db_upgrade_and_keys_create_print_only_the_key(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["db", "upgrade"]) == 0
    engine = make_engine(f"sqlite:///{data_dir / 'cahp.db'}")
    assert "jobs" in inspect(engine).get_table_names()
    capsys.readouterr()
    assert main(["keys", "create", "--name", "ci-pipeline"]) == 0
    out = capsys.readouterr().out
    key = out.strip()
    assert out == key + "\n"
    with make_session_factory(engine)() as session:
        assert authenticate(session=session, key=key).name == "ci-pipeline"
    engine.dispose()
    assert main(["keys", "create", "--name", "   "]) == ExitCode.USAGE


def test_client_commands_report_an_unreachable_server(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    # --timeout 0: one try, no retries (tests/reliability/test_client_survives.py covers the retrying).
    assert main(["status", "abc", "--url", url, "--timeout", "0"]) == ExitCode.UNAVAILABLE
    assert "cannot reach" in capsys.readouterr().err
    assert main(["submit", "--model", "hf://a/b", "--dataset", "hf://datasets/c", "--param", "nonsense",
                 "--url", url]) == ExitCode.USAGE
    assert main(["submit", "--model", "./no/such/dir", "--dataset", "hf://datasets/c", "--url", url]) == ExitCode.USAGE
    assert "neither a URI" in capsys.readouterr().err


def test_every_command_is_registered() -> None:
    parser = build_parser()
    commands = next(a for a in parser._subparsers._group_actions).choices  # type: ignore[union-attr]
    assert {"serve", "worker", "db", "keys", "upload", "submit", "status", "wait", "download", "jobs",
            "delete", "prune"} <= set(commands)
    # Client commands keep trying a busy or unreachable server for 30 s by default; `wait` has no limit.
    for command, *rest in (["upload", "x"], ["submit", "--model", "m", "--dataset", "d"], ["status", "j"],
                           ["download", "j"], ["jobs"], ["delete", "j"]):
        assert parser.parse_args([command, *rest]).timeout == 30.0, command
    assert parser.parse_args(["wait", "j"]).timeout is None


# --- the client commands against a scripted server ---------------------------------------------------

JOB = {"id": "j1", "status": "running", "stage": "recovery", "progress": 0.5, "cancel_requested": False,
       "labels": {"branch": "main"}, "error": None, "links": {"self": "/v1/jobs/j1"}, "added_later": [1, 2]}


class _Scripted:
    """A real HTTP server that answers each ``GET``/``POST`` path with the next (status, JSON body) listed for it."""

    def __init__(self, answers: Answers) -> None:
        outer = self
        self.answers = answers

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                path = self.path.split("?")[0]
                queue = outer.answers.get(path) or [(404, {"code": "not_found", "detail": f"no {path}"})]
                status, body = queue.pop(0) if len(queue) > 1 else queue[0]
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json" if status < 400 else "application/problem+json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _answer

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


Answers = dict[str, list[tuple[int, Any]]]


@pytest.fixture
def scripted() -> Iterator[Callable[[Answers], _Scripted]]:
    """Start a scripted server (closed after the test) for the answers given."""
    servers: list[_Scripted] = []

    def start(answers: Answers) -> _Scripted:
        servers.append(_Scripted(answers))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.mark.parametrize(("status", "code"), [
    (400, ExitCode.USAGE), (401, ExitCode.USAGE), (403, ExitCode.USAGE), (404, ExitCode.USAGE),
    (409, ExitCode.USAGE), (410, ExitCode.USAGE), (413, ExitCode.USAGE), (415, ExitCode.USAGE),
    (422, ExitCode.USAGE), (429, ExitCode.USAGE), (500, ExitCode.UNAVAILABLE), (502, ExitCode.UNAVAILABLE),
    (503, ExitCode.UNAVAILABLE), (507, ExitCode.UNAVAILABLE),
])
def test_a_problem_answer_exits_by_its_status_family(status: int, code: ExitCode, scripted: Any,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    # --timeout 0: one try, so 429 and 502-504 are not tried again.
    server = scripted({"/v1/jobs/j1": [(status, {"code": "some_code", "detail": "what went wrong"})]})
    assert main(["status", "j1", "--url", server.url, "--timeout", "0"]) == code
    assert capsys.readouterr().err == f"cahp: what went wrong (some_code, HTTP {status})\n"


def test_the_exit_code_table_by_class() -> None:
    assert exit_code_for(TransportError("down")) == ExitCode.UNAVAILABLE
    assert exit_code_for(InvalidResponseError("garbled")) == ExitCode.UNAVAILABLE
    assert exit_code_for(ServerError(500, "internal_error", "x")) == ExitCode.UNAVAILABLE
    for problem in (BadRequestError, AuthError, NotFoundError, RateLimitedError):
        assert exit_code_for(problem(499, "c", "x")) == ExitCode.USAGE
    assert exit_code_for(ChecksumError("bad bytes")) == ExitCode.FAILED
    assert exit_code_for(WaitTimeoutError("still running")) == ExitCode.TIMEOUT
    assert exit_code_for(FileNotFoundError("no such file")) == ExitCode.USAGE
    assert exit_code_for(json.JSONDecodeError("bad", "{", 0)) == ExitCode.USAGE
    assert exit_code_for(RuntimeError("a bug")) is None  # not ours to hide: it propagates


def test_status_and_jobs_print_from_the_records_and_json_prints_the_answer_whole(
        scripted: Any, capsys: pytest.CaptureFixture[str]) -> None:
    failed = {**JOB, "id": "j2", "status": "failed", "stage": None,
              "error": {"code": "oom", "message": "out of memory"}}
    server = scripted({"/v1/jobs/j1": [(200, JOB)], "/v1/jobs": [(200, {"data": [JOB, failed], "next_cursor": None})]})
    common = ["--url", server.url]
    assert main(["status", "j1", *common]) == 0
    assert capsys.readouterr().out == "j1 running recovery 50%\n"
    assert main(["status", "j1", "--json", *common]) == 0
    assert json.loads(capsys.readouterr().out) == JOB  # unknown fields included, as sent
    assert main(["jobs", *common]) == 0
    assert capsys.readouterr().out.splitlines() == ["j1 running recovery 50%  branch=main",
                                                    "j2 failed: oom: out of memory  branch=main"]
    assert main(["jobs", "--json", *common]) == 0
    assert json.loads(capsys.readouterr().out) == [JOB, failed]


@pytest.mark.parametrize(("final", "code"), [
    ({"status": "succeeded"}, ExitCode.OK),
    ({"status": "failed", "error": {"code": "oom", "message": "out of memory"}}, ExitCode.FAILED),
    ({"status": "cancelled"}, ExitCode.CANCELLED),
])
def test_wait_exits_by_how_the_job_ended(final: dict[str, Any], code: ExitCode, scripted: Any,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    server = scripted({"/v1/jobs/j1": [(200, JOB), (200, {**JOB, "stage": None, **final})]})
    assert main(["wait", "j1", "--interval", "0.05", "--url", server.url]) == code
    err = capsys.readouterr().err
    assert "j1 running recovery 50%" in err
    if final["status"] == "failed":
        assert "cahp: job j1 failed: oom: out of memory" in err
    if final["status"] == "cancelled":
        assert "cahp: job j1 cancelled: cancelled: " in err


def test_wait_gives_up_at_its_timeout_and_a_garbled_answer_is_the_servers_fault(
        scripted: Any, capsys: pytest.CaptureFixture[str]) -> None:
    server = scripted({"/v1/jobs/j1": [(200, JOB)], "/v1/jobs/bad": [(200, {"id": 7, "status": "running"})]})
    assert main(["wait", "j1", "--timeout", "0.3", "--interval", "0.05", "--quiet", "--url", server.url]) == \
        ExitCode.TIMEOUT
    assert "cahp: job j1 is still running after 0.3 s" in capsys.readouterr().err
    assert main(["status", "bad", "--url", server.url, "--timeout", "0"]) == ExitCode.UNAVAILABLE
    assert "`id` is not what the API documents" in capsys.readouterr().err


def test_wait_prints_the_time_left_and_one_phrase_for_a_broken_stream(
        scripted: Any, capsys: pytest.CaptureFixture[str]) -> None:
    running = {"id": "j1", "status": "running", "stage": "recovery", "progress": 0.5, "eta_s": 754.0}
    server = scripted({"/v1/jobs/j1": [(200, running), (200, {**running, "status": "succeeded", "eta_s": None})]})
    assert main(["wait", "j1", "--interval", "0.05", "--url", server.url]) == 0
    assert "j1 running recovery 50%, about 13 min left" in capsys.readouterr().err

    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    assert main(["wait", "j1", "--follow", "--timeout", "0.5", "--url", f"http://127.0.0.1:{port}"]) != 0
    err = capsys.readouterr().err
    assert "the event stream of j1: the connection broke" in err and "the event stream of j1 broke" not in err
