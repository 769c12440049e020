"""The floors of the house and the one-way rule between them (docs/architecture.md).

    cahp_engine  <-  app.core  <-  {app.api, worker}  <-  app.cli
                     app.core  <-  migrations
    app.http_headers  <-  app.client  <-  app.cli          app.http_headers  <-  app.api

Each package may import only the floors below it, and nothing imports ``bench`` or ``studies``. Checked twice:
by reading every import statement in the source (lazy imports inside functions included), and by
importing every module of a floor in a fresh interpreter and looking at what got loaded. ``migrations``
imports ``app.core`` (the tables' metadata), and ``app.core`` finds ``migrations/`` as a directory,
never as an import. The HTTP client and the header module it shares with the API import from an allow
list: httpx, tenacity and the standard library for the one, the standard library for the other. Client
commands of ``cahp`` must not load the engine's torch code or the service's server libraries.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SERVICE_LIBS = {"fastapi", "starlette", "uvicorn", "celery", "kombu", "sqlalchemy", "alembic", "redis", "boto3",
                "botocore", "psycopg"}

#: The benchmarks and the studies measure and experiment on the product; nothing in the product imports them.
OUTSIDE = {"bench", "studies"}

#: floor -> (its source directory, top-level names it must never import)
RULES: dict[str, tuple[str, set[str]]] = {
    "cahp_engine": ("cahp_engine", {"app", "worker", "migrations", *OUTSIDE, *SERVICE_LIBS}),
    "app.core": ("app/core", {"app.api", "app.cli", "app.client", "worker", "migrations", *OUTSIDE, "fastapi",
                              "starlette", "uvicorn", "celery", "kombu"}),
    "app.api": ("app/api", {"app.cli", "app.client", "worker", "migrations", *OUTSIDE}),
    "worker": ("worker", {"app.api", "app.cli", "app.client", "migrations", *OUTSIDE, "fastapi", "starlette",
                          "uvicorn"}),
    "app.cli": ("app/cli", {"migrations", *OUTSIDE}),
    "app.client": ("app/client", {"app.core", "app.api", "app.cli", "worker", "cahp_engine", "migrations", *OUTSIDE,
                                  *SERVICE_LIBS, "torch", "transformers", "numpy"}),
    "app.http_headers": ("app/http_headers.py", {"app.core", "app.api", "app.cli", "app.client", "worker",
                                                 "cahp_engine", "migrations", *OUTSIDE, *SERVICE_LIBS, "httpx",
                                                 "tenacity"}),
    # Alembic's scripts: the tables' metadata from app.core, nothing of the floors that use the database.
    "migrations": ("migrations", {"app.api", "app.cli", "app.client", "worker", "cahp_engine", *OUTSIDE, "fastapi",
                                  "starlette", "uvicorn", "celery", "kombu"}),
}

#: Modules that may import only what is listed (and the standard library): module -> (source, allowed prefixes).
ALLOWED: dict[str, tuple[str, set[str]]] = {
    "app.client": ("app/client", {"app.client", "app.http_headers", "httpx", "tenacity"}),
    "app.http_headers": ("app/http_headers.py", set()),
}


def _imports(path: Path) -> list[str]:
    """Absolute module names imported anywhere in ``path`` (relative imports resolved)."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    names = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            names.append(module)
            names += [f"{module}.{alias.name}" for alias in node.names]
    return names


def _forbidden(name: str, banned: set[str]) -> bool:
    return any(name == b or name.startswith(b + ".") for b in banned)


@pytest.mark.parametrize("module", list(ALLOWED))
def test_the_client_and_the_header_module_import_only_their_allow_list(module: str) -> None:
    where, allowed = ALLOWED[module]
    offenders = [f"{path.relative_to(ROOT)}: {name}" for path in _files(where) for name in _imports(path)
                 if name.split(".")[0] not in sys.stdlib_module_names and not _forbidden(name, allowed)]
    assert offenders == []


def test_app_core_finds_the_migrations_as_a_directory_and_they_import_app_core() -> None:
    # The one arrow between them runs migrations -> app.core; app.core.db hands Alembic a path.
    from app.core.db import migrations_dir

    assert migrations_dir() == ROOT / "migrations" and (migrations_dir() / "env.py").is_file()
    assert "app.core.db" in _imports(ROOT / "migrations" / "env.py")


def _files(where: str) -> list[Path]:
    path = ROOT / where
    return [path] if path.is_file() else sorted(path.rglob("*.py"))


@pytest.mark.parametrize("floor", list(RULES))
def test_the_source_of_each_floor_imports_only_the_floors_below(floor: str) -> None:
    where, banned = RULES[floor]
    offenders = [f"{path.relative_to(ROOT)}: {name}" for path in _files(where) for name in _imports(path)
                 if _forbidden(name, banned)]
    assert offenders == []


def test_nothing_imports_bench_or_studies() -> None:
    offenders = [f"{path.relative_to(ROOT)}: {name}"
                 for top in ("cahp_engine", "app", "worker", "migrations")
                 for path in sorted((ROOT / top).rglob("*.py")) for name in _imports(path)
                 if _forbidden(name, OUTSIDE)]
    assert offenders == []


def _loaded_after_importing(modules: list[str]) -> set[str]:
    code = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def _modules(where: str) -> list[str]:
    found = []
    for path in _files(where):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


# migrations/env.py runs Alembic when imported, so that floor is checked by its source only.
@pytest.mark.parametrize("floor", ["cahp_engine", "app.core", "app.api", "worker", "app.cli", "app.client",
                                   "app.http_headers"])
def test_importing_every_module_of_a_floor_loads_nothing_from_above(floor: str) -> None:
    where, banned = RULES[floor]
    loaded = _loaded_after_importing(_modules(where))
    assert sorted(name for name in loaded if _forbidden(name, banned)) == []


def test_a_client_command_loads_neither_the_engine_nor_the_server_libraries() -> None:
    # `cahp status` against a port nothing listens on: it fails (exit 5) after building the whole parser,
    # without retrying (--timeout 0).
    code = (
        "import json, sys\n"
        "from app.cli import main\n"
        "code = main(['status', 'job', '--url', 'http://127.0.0.1:9', '--timeout', '0'])\n"
        "print(json.dumps([code, sorted(sys.modules)]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    code, loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert code == 5
    heavy = {"torch", "transformers", "numpy", "sklearn", "fastapi", "sqlalchemy", "celery", "kombu", "uvicorn",
             "boto3", "app.core", "app.api", "worker"}
    assert sorted(name for name in loaded if _forbidden(name, heavy)) == []


def test_no_module_of_the_service_is_over_450_lines() -> None:
    sizes = {str(path.relative_to(ROOT)): len(path.read_text().splitlines())
             for top in ("app", "worker") for path in sorted((ROOT / top).rglob("*.py"))}
    assert {name: n for name, n in sizes.items() if n > 450} == {}


def test_no_test_imports_another_test_module() -> None:
    """Shared setup lives in ``tests/support`` (or a folder's ``conftest.py`` as fixtures); a test module that
    imports another runs that module's collection twice and ties two files' helpers together."""
    borrowed = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for name in _imports(path):
            last = name.rsplit(".", 2)
            if name.startswith("tests.") and any(part.startswith("test_") or part == "conftest" for part in last):
                borrowed.append(f"{path.relative_to(ROOT)} imports {name}")
    assert borrowed == []
