"""The server-side `cahp` commands in-process, and the client commands' error exits."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import inspect

from app.cli import ExitCode, build_parser, main
from app.core.db import make_engine, make_session_factory
from app.core.keys import authenticate
from app.core.settings import get_settings
from tests.api.helpers import free_port


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
