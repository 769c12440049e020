"""The engine's shape: rooms that publish their names once, imports without circles, small modules,
and names that load no torch where the command line and the job service need them light.

Each room (``data``, ``models``, ``selection``, ``recovery``, ``export``, ``run``) keeps its code in
private modules and publishes its names from ``__init__.pyi``; ``cahp_engine`` itself re-exports the
names a user starts with. The rules checked here:

* every public name is published by exactly one room (its one import path);
* a module outside a room never imports that room's private modules;
* the graph of "module -> the module that defines what it imports" has no cycle;
* rooms depend on each other in one order: data, models -> selection, recovery -> export -> run.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "cahp_engine"
ROOMS = ("data", "models", "selection", "recovery", "export", "run")
#: Which rooms each room may import (the shared top-level modules are open to all).
ROOM_ORDER = {
    "data": set(),
    "models": set(),
    "selection": {"data", "models"},
    "recovery": {"data", "models"},
    "export": {"data", "models", "recovery"},
    "run": {"data", "models", "selection", "recovery", "export"},
}
#: Names the command line and the job service import to build parsers and schemas: they load no torch.
LIGHT = (
    ("cahp_engine", "PruningConfig"),
    ("cahp_engine.config", "PruningConfig"),
    ("cahp_engine.data", "DatasetOptions"),
    ("cahp_engine.data", "DATASET_OPTION_FIELDS"),
    ("cahp_engine.data", "FILE_SUFFIXES"),
    ("cahp_engine.config", "STRATEGIES"),
    ("cahp_engine.run", "RunReport"),
    ("cahp_engine.run", "RunSummary"),
    ("cahp_engine.recovery", "ClassificationMetrics"),
    ("cahp_engine.recovery", "TrainingResult"),
    ("cahp_engine.selection", "SamplingRecord"),
    ("cahp_engine.results", "BudgetRecord"),
    ("cahp_engine.errors", "CahpError"),
    ("cahp_engine.progress", "STAGE_SPAN"),
)
HEAVY = ("torch", "transformers", "numpy", "scipy", "sklearn", "datasets", "pyarrow", "matplotlib")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _engine_files() -> list[Path]:
    strategies = ENGINE / "selection" / "_strategies"
    return sorted(p for p in ENGINE.rglob("*.py") if p.name != "__init__.py" or p.parent == strategies)


def _stub_exports() -> dict[str, dict[str, str]]:
    """room -> public name -> the private module (dotted) that defines it, read from each room's stub."""
    exports: dict[str, dict[str, str]] = {}
    for room in ROOMS:
        names: dict[str, str] = {}
        for node in ast.parse((ENGINE / room / "__init__.pyi").read_text()).body:
            if isinstance(node, ast.ImportFrom):
                assert node.level == 1 and node.module and node.module.startswith("_"), ast.dump(node)
                for alias in node.names:
                    names[alias.name] = f"cahp_engine.{room}.{node.module}"
        exports[room] = names
    return exports


def _imports(path: Path) -> list[tuple[str, str | None]]:
    """(module, name) for every ``from module import name`` and (module, None) for every ``import module``."""
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names]
    return found


def _room(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "cahp_engine" and parts[1] in ROOMS else None


def test_no_engine_module_is_over_450_lines():
    long = {str(p.relative_to(ROOT)): n for p in ENGINE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 450}
    assert long == {}


def test_every_room_keeps_its_code_private_and_publishes_from_its_stub():
    for room in ROOMS:
        modules = sorted(p.name for p in (ENGINE / room).iterdir() if p.suffix == ".py" or p.is_dir())
        assert [m for m in modules if not m.startswith("_")] == [], room
        assert (ENGINE / room / "__init__.pyi").is_file(), room
    # Every name a stub declares is really there, from the module the stub names.
    for room, names in _stub_exports().items():
        loaded = importlib.import_module(f"cahp_engine.{room}")
        for name, module in names.items():
            assert getattr(loaded, name) is getattr(importlib.import_module(module), name), (room, name)
        assert sorted(loaded.__all__) == sorted(names), room


def test_every_public_name_has_one_import_path():
    rooms_of: dict[str, list[str]] = defaultdict(list)
    for room, names in _stub_exports().items():
        for name in names:
            rooms_of[name].append(room)
    assert {name: rooms for name, rooms in rooms_of.items() if len(rooms) > 1} == {}
    # The shared top-level modules publish nothing a room publishes too.
    for top in ("config", "errors", "results", "progress"):
        tree = ast.parse((ENGINE / f"{top}.py").read_text())
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
        assert sorted(defined & set(rooms_of)) == [], top


def test_no_module_outside_a_room_imports_its_private_modules():
    offenders = []
    for top in ("cahp_engine", "app", "worker"):
        for path in sorted((ROOT / top).rglob("*.py")):
            here = _room(_module_name(path))
            for module, _name in _imports(path):
                target = _room(module)
                if target and target != here and module != f"cahp_engine.{target}":
                    offenders.append(f"{path.relative_to(ROOT)}: {module}")
    assert offenders == []


def _definer(module: str, name: str | None, exports: dict[str, dict[str, str]]) -> str | None:
    """The engine module whose code runs for this import (a room's public name resolves to its module)."""
    if not module.startswith("cahp_engine"):
        return None
    room = _room(module)
    if room and module == f"cahp_engine.{room}":
        if name in exports[room]:
            return exports[room][name]
        return f"{module}.{name}"  # a private module imported from its room: `from cahp_engine.run import _steps`
    if module == "cahp_engine" and name is not None:
        candidate = f"cahp_engine.{name}"
        return candidate if importlib.util.find_spec(candidate) else None
    return module


def test_engine_imports_have_no_cycle_and_rooms_follow_their_order():
    exports = _stub_exports()
    graph: dict[str, set[str]] = {}
    for path in _engine_files():
        here = _module_name(path)
        targets = {_definer(m, n, exports) for m, n in _imports(path)}
        graph[here] = {t for t in targets if t and t != here}
    wrong_way = sorted(f"{a} -> {b}" for a, bs in graph.items() for b in bs
                       if _room(a) and _room(b) and _room(b) != _room(a) and _room(b) not in ROOM_ORDER[_room(a)])
    assert wrong_way == []
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append([*trail[trail.index(nxt):], nxt] if nxt in trail else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert cycles == []


@pytest.mark.parametrize(("module", "name"), LIGHT)
def test_light_names_load_no_torch_numpy_or_transformers(module, name):
    code = f"import sys\nfrom {module} import {name}\nprint(','.join(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == ""


@pytest.mark.parametrize(
    ("module", "names"),
    [
        # What the README and the docs name.
        ("cahp_engine", ("PruningConfig", "load_pruned", "save_pruned", "prune_heads", "select_heads", "run_pruning",
                         "load_classifier", "load_splits", "analyze_heads", "choose", "RunReport", "export_onnx")),
        ("cahp_engine.data", ("encode", "DatasetOptions", "DatasetSplits", "FILE_SUFFIXES", "DATASET_OPTION_FIELDS",
                              "check_split_name", "load_splits")),
        ("cahp_engine.models", ("check_weight_files", "load_pruned", "save_pruned", "load_classifier",
                                "prune_heads")),
        ("cahp_engine.selection", ("select_heads", "SelectionResult", "analyze_heads", "choose")),
        ("cahp_engine.recovery", ("finetune", "evaluate", "count_parameters", "compare_speed", "measure_latency")),
        ("cahp_engine.export", ("export_onnx", "quantize_int8", "build_model_card", "ModelCardInputs")),
        ("cahp_engine.run", ("ARTIFACT_FILES", "run_pruning", "RunReport", "RunSummary")),
        ("cahp_engine.config", ("PruningConfig", "REPORTED_DEGREES", "DENSE_FINETUNE_MODES", "STRATEGIES",
                                "CONSENSUS_STRATEGIES")),
        ("cahp_engine.recovery", ("ClassificationMetrics", "ParameterCounts", "Latency", "TrainingResult")),
        ("cahp_engine.results", ("JsonRecord",)),
        ("cahp_engine.progress", ("STAGE_SPAN",)),
    ],
)
def test_public_names_stay_importable(module, names):
    loaded = importlib.import_module(module)
    assert [n for n in names if not hasattr(loaded, n)] == []


def test_the_bottom_floor_imports_no_room():
    """The shared modules (config, errors, results, progress and their private helpers) are what the rooms
    stand on: the parameter spec lists the strategies' names from here, not from the selection room."""
    bottom = [p for p in ENGINE.glob("*.py") if p.name != "__init__.py"]
    upward = [f"{p.name}: {module}" for p in bottom for module, _name in _imports(p) if _room(module)]
    assert upward == []
