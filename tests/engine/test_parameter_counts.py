"""The run and recovery rooms' functions take at most five parameters each.

A step that needs more takes a small frozen record of what travels together (``RunRequest`` and
``RunHooks`` for ``run_pruning``, ``StageTraining`` for a fine-tuning, ``SearchSummary`` for a budget's
record, ``SearchInputs`` for what its candidates share, ``FastestScope`` for the fastest target's search,
``ScoreKeeping`` and ``SavePolicy`` for what a run keeps, ``AccuracyBudget`` for the quality checks,
``HeadMap`` and ``MssPlot`` for the figures; ``TrainingRecipe``, ``ValidationWatch`` and ``FineTuningHooks``
for ``finetune`` and ``FineTuning``), or the function is split. Every parameter counts, keyword-only
ones, ``*args`` and ``**kwargs`` included; a method's ``self`` (or ``cls``) does not. A dataclass's generated
``__init__`` is not written in the source and is not counted. The recovery room's few exceptions are listed
below, each with its reason; the list must match exactly, so a function brought down leaves it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "cahp_engine" / "run"
RECOVERY = ROOT / "cahp_engine" / "recovery"
MOST = 5
#: The recovery room's functions that take more than :data:`MOST` parameters: how many, and why.
RECOVERY_EXCEPTIONS: dict[str, tuple[int, str]] = {
    "_bootstrap.py:drop_interval": (8, "a statistic over three prediction arrays with its metric, seed and "
                                       "resampling knobs, called like scipy.stats.bootstrap"),
    "_distillation.py:distillation_loss": (6, "a loss over tensors in torch.nn.functional's style (logits, "
                                              "targets, keyword weights)"),
    "_evaluation.py:measure_latency": (7, "a benchmark's keyword knobs with defaults (device, warmup, repeats, "
                                          "seed), like timeit's; a timing record would be shared with the export "
                                          "room's compare_runtimes, which has more"),
    "_evaluation.py:compare_speed": (8, "as measure_latency, with a second model and the batch sizes compared"),
    "_reconstruction.py:reconstruct": (7, "models, batches and options, then a stage's seed and its progress "
                                          "and cancel callbacks, as the selection room's stages take them"),
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


def test_the_recovery_room_takes_five_parameters_but_for_its_listed_exceptions() -> None:
    found, long = long_functions(RECOVERY)
    assert found > 50, "too few functions found: the room moved"
    assert long == {name: n for name, (n, _why) in RECOVERY_EXCEPTIONS.items()}, (
        f"group what travels together into a small frozen record (at most {MOST} parameters), or list the "
        "function in RECOVERY_EXCEPTIONS with its reason (and take out one brought down)")


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
