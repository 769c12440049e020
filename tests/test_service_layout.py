"""The service's shape, checked as the engine's is (tests/engine/test_layout.py): rooms that publish their
names once and keep their modules private.

``app.core`` holds a few shared modules (settings, errors, the queue contract...) and four rooms: ``db``
(the database, its tables, the repository), ``inputs`` (what a job reads and its checks), ``security``
(keys, signed links, the outbound guard) and ``sandbox`` (bounded child processes that read untrusted
content). ``app.api`` keeps its background loops in ``background``. Each room
keeps its code in private modules and publishes its names from ``__init__.pyi`` (loaded lazily); its two
sub-rooms, ``db.repository`` and ``inputs.sources``, publish theirs from their ``__init__``. The rules:

* every public name of a room is published by exactly one room (its one import path);
* a module outside a room (or sub-room) never imports that room's private modules (a sub-room is inside its
  room);
* ``app.core`` grows by rooms: a new flat module is a decision, made here.
"""

from __future__ import annotations

import ast
import importlib
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Rooms whose names are published by a lazy stub.
ROOMS = ("app.core.db", "app.core.inputs", "app.core.security", "app.core.sandbox", "app.api.background")
#: Rooms inside rooms, publishing from their ``__init__``: a namespace of functions, a registry of schemes.
SUB_ROOMS = ("app.core.db.repository", "app.core.inputs.sources")
#: The shared modules of app.core, beside its rooms (like the engine's config, errors, results, progress).
CORE_MODULES = {"errors", "labels", "machine", "metrics", "metrics_dir", "mlflow_registry", "params", "periodic",
                "queue", "settings", "storage"}


def _directory(room: str) -> Path:
    return ROOT.joinpath(*room.split("."))


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _stub_exports(room: str) -> dict[str, str]:
    """Public name -> the private module (dotted) that defines it, read from the room's stub."""
    names: dict[str, str] = {}
    for node in ast.parse((_directory(room) / "__init__.pyi").read_text()).body:
        if isinstance(node, ast.ImportFrom):
            assert node.level == 1, ast.dump(node)
            if node.module is None:  # `from . import repository`: a sub-room
                names.update({alias.name: f"{room}.{alias.name}" for alias in node.names})
                continue
            assert node.module.startswith("_"), ast.dump(node)
            names.update({alias.name: f"{room}.{node.module}" for alias in node.names})
    return names


def _enclosing(module: str) -> str | None:
    """The innermost room or sub-room that holds ``module`` (itself when it is one)."""
    found = [r for r in (*ROOMS, *SUB_ROOMS) if module == r or module.startswith(r + ".")]
    return max(found, key=len) if found else None


@pytest.mark.parametrize("room", ROOMS + SUB_ROOMS)
def test_every_room_keeps_its_modules_private(room: str) -> None:
    here = _directory(room)
    inner = {r.rsplit(".", 1)[1] for r in SUB_ROOMS if r.startswith(room + ".")}
    modules = sorted(p.stem if p.suffix == ".py" else p.name for p in here.iterdir()
                     if (p.suffix == ".py" or (p.is_dir() and p.name != "__pycache__")) and p.name != "__init__.py")
    assert [m for m in modules if not m.startswith("_") and m not in inner] == []


@pytest.mark.parametrize("room", ROOMS)
def test_a_room_publishes_from_its_stub_what_its_modules_define(room: str) -> None:
    loaded = importlib.import_module(room)
    names = _stub_exports(room)
    for name, module in names.items():
        if module == f"{room}.{name}":
            assert getattr(loaded, name) is importlib.import_module(module), name
        else:
            assert getattr(loaded, name) is getattr(importlib.import_module(module), name), name
    assert sorted(loaded.__all__) == sorted(names)


def test_every_public_name_has_one_room() -> None:
    rooms_of: dict[str, list[str]] = defaultdict(list)
    for room in ROOMS:
        for name in _stub_exports(room):
            rooms_of[name].append(room)
    for room in SUB_ROOMS:
        for name in importlib.import_module(room).__all__:
            rooms_of[name].append(room)
    assert {name: rooms for name, rooms in rooms_of.items() if len(rooms) > 1} == {}


def test_no_module_outside_a_room_imports_its_private_modules() -> None:
    offenders = []
    for top in ("app", "worker", "migrations"):
        for path in sorted((ROOT / top).rglob("*.py")):
            here = _module_name(path)
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
                elif isinstance(node, ast.Import):
                    targets = [a.name for a in node.names]
                else:
                    continue
                for target in targets:
                    room = _enclosing(target)
                    private = room is not None and target.removeprefix(room + ".").startswith("_")
                    if private and not (here == room or here.startswith(f"{room}.")):
                        offenders.append(f"{path.relative_to(ROOT)}: {target}")
    assert offenders == []


def test_app_core_is_its_shared_modules_and_its_rooms() -> None:
    core = ROOT / "app" / "core"
    flat = {p.stem for p in core.glob("*.py") if p.name != "__init__.py"}
    rooms = {p.name for p in core.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert (flat, rooms) == (CORE_MODULES, {"db", "inputs", "sandbox", "security"})


@pytest.mark.parametrize("room", ROOMS)
def test_a_rooms_stub_ships_in_the_package(room: str) -> None:
    """lazy_loader reads ``__init__.pyi`` at import time: an installed package without it cannot import the room."""
    import fnmatch
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    stub = f"{room.replace('.', '/')}/__init__.pyi"
    shipped = [f"{package}:{pattern}" for package, patterns in data.items() for pattern in patterns
               if stub.startswith(package.replace(".", "/") + "/")
               and fnmatch.fnmatch(stub.removeprefix(package.replace(".", "/") + "/"), pattern)]
    assert shipped != []
