"""The run room's functions take at most five parameters each.

A step that needs more takes a small frozen record of what travels together (``RunRequest`` and
``RunHooks`` for ``run_pruning``, ``StageTraining`` for a fine-tuning, ``SearchSummary`` for a budget's
record, ``SearchInputs`` for what its candidates share, ``FastestScope`` for the fastest target's search,
``ScoreKeeping`` and ``SavePolicy`` for what a run keeps, ``AccuracyBudget`` for the quality checks,
``HeadMap`` and ``MssPlot`` for the figures), or the function is split. Every parameter counts, keyword-only
ones, ``*args`` and ``**kwargs`` included; a method's ``self`` (or ``cls``) does not. A dataclass's generated
``__init__`` is not written in the source and is not counted.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "cahp_engine" / "run"
MOST = 5


def parameter_counts(source: str) -> dict[str, int]:
    """Qualified name -> parameters of every function defined in ``source`` (methods without ``self``)."""
    counts: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str, in_class: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                args = child.args
                names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
                names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
                static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in child.decorator_list)
                if in_class and not static and names[:1] in (["self"], ["cls"]):
                    names = names[1:]
                counts[prefix + child.name] = len(names)
                visit(child, f"{prefix}{child.name}.", False)
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.", True)
            else:
                visit(child, prefix, in_class)

    visit(ast.parse(source), "", False)
    return counts


def long_functions(room: Path) -> tuple[int, dict[str, int]]:
    """How many functions the modules of ``room`` define, and those taking more than :data:`MOST` parameters
    (``module:qualified name`` -> how many)."""
    counts = {f"{path.name}:{name}": n for path in sorted(room.glob("*.py"))
              for name, n in parameter_counts(path.read_text()).items()}
    return len(counts), {name: n for name, n in counts.items() if n > MOST}


def test_no_function_of_the_run_room_takes_more_than_five_parameters() -> None:
    found, long = long_functions(RUN)
    assert found > 100, "too few functions found: the room moved"
    assert long == {}, f"group what travels together into a small frozen record (at most {MOST} parameters)"


def test_the_check_sees_a_function_with_six_parameters(tmp_path: Path) -> None:
    (tmp_path / "_steps.py").write_text(
        "def five(a, b, c, *, d, e=1):\n"
        "    pass\n"
        "class Step:\n"
        "    def __init__(self, a, b, c, d, e, f):\n"
        "        pass\n"
    )
    assert long_functions(tmp_path) == (2, {"_steps.py:Step.__init__": 6})


def test_the_count_takes_every_kind_of_parameter_and_leaves_out_self() -> None:
    source = (
        "def f(a, /, b, *args, c, d=1, **kwargs):\n"
        "    def inner(x, y):\n"
        "        pass\n"
        "class C:\n"
        "    def m(self, a, b):\n"
        "        pass\n"
        "    @classmethod\n"
        "    def n(cls, *, a):\n"
        "        pass\n"
        "    @staticmethod\n"
        "    def s(self):\n"
        "        pass\n"
    )
    assert parameter_counts(source) == {"f": 6, "f.inner": 2, "C.m": 2, "C.n": 1, "C.s": 1}
