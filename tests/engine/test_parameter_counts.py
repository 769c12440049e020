"""The run room's functions take at most five parameters each.

A step that needs more takes a small frozen record of what travels together (``RunRequest`` and
``RunHooks`` for ``run_pruning``, ``StageTraining`` for a fine-tuning, ``SearchSummary`` for a budget's
record, ``HeadMap`` and ``MssPlot`` for the figures). Every parameter counts, keyword-only ones, ``*args``
and ``**kwargs`` included; a method's ``self`` (or ``cls``) does not. A dataclass's generated ``__init__``
is not written in the source and is not counted.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "cahp_engine" / "run"
MOST = 5

#: Functions that still take more, by ``module:qualified name``, with how many. Each is to be cut down; an entry
#: that is no longer needed fails the test, so the list only shrinks.
STILL_LONG = {
    # The accuracy budget's search: the run, its inputs, selection, teacher, the dense model's validation
    # scores and predictions, and the resume book.
    "_steps.py:budget_search": 6,
    "_run.py:_within_budget": 6,
    # The fastest model within a budget: its inputs, its selection, its rows, its split, two callbacks, a cache.
    "_fastest.py:fastest_search": 7,
    "_run.py:_fastest_within_budget": 6,
    # Public and called by tests and benchmarks with these arguments.
    "_quality.py:assess_quality": 6,
    "_reconstruct.py:reconstruct_pruned": 6,
    # A store, the settings, the log and three optional seams of the resume state.
    "_resume.py:Resumer.__init__": 7,
    # The judged search's scores: its ladder, inputs, log, progress, resume book and a test's scorer.
    "_scoring.py:LazyScores.__init__": 6,
}


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


def test_no_function_of_the_run_room_takes_more_than_five_parameters() -> None:
    long = {f"{path.name}:{name}": n for path in sorted(RUN.glob("*.py"))
            for name, n in parameter_counts(path.read_text()).items() if n > MOST}
    assert long, "no function found with more parameters: the room moved, or STILL_LONG can go"
    new = {name: n for name, n in long.items() if name not in STILL_LONG}
    assert new == {}, f"group what travels together into a small frozen record (at most {MOST} parameters)"
    grown = {name: n for name, n in long.items() if n > STILL_LONG.get(name, n)}
    assert grown == {}, "these take more parameters than STILL_LONG says"
    cut = sorted(set(STILL_LONG) - set(long))
    assert cut == [], "these take at most five parameters now: remove them from STILL_LONG"


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
