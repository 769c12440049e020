"""Each class name says one thing: no top-level class name is defined in two modules of the product.

A reader who meets ``Artifact`` or ``Page`` in ``cahp_engine/``, ``app/`` or ``worker/`` finds one definition,
whatever room they are in. Records that mirror another package's under the same name (the client's answers
beside the API's schemas it reads, a worker's protocol beside the class it describes) take names of their own,
and private helper classes (``_Slot``) count too: a search for the name must land on one class.

Nothing is allowed twice, so there is no allow-list.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("app", "worker", "cahp_engine")


def top_level_classes(roots: tuple[Path, ...]) -> dict[str, list[str]]:
    """Class name -> the modules (paths from ``ROOT``) that define it at their top level."""
    defined: dict[str, list[str]] = defaultdict(list)
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            for node in ast.parse(path.read_text(), filename=str(path)).body:
                if isinstance(node, ast.ClassDef):
                    defined[node.name].append(str(path.relative_to(root.parent)))
    return defined


def test_no_class_name_is_defined_in_two_modules() -> None:
    defined = top_level_classes(tuple(ROOT / package for package in PACKAGES))
    assert defined, "no classes found: the packages moved"
    twice = {name: modules for name, modules in defined.items() if len(modules) > 1}
    assert not twice, f"class names defined in more than one module (give each its own name): {twice}"


def test_the_check_sees_a_name_defined_twice(tmp_path: Path) -> None:
    for package, source in (("one", "class Page:\n    pass\n"), ("two", "import x\n\n\nclass Page(x.Y):\n    pass\n")):
        (tmp_path / package).mkdir()
        (tmp_path / package / "_records.py").write_text(source)
    (tmp_path / "two" / "nested.py").write_text("def f():\n    class Page:\n        pass\n")
    assert top_level_classes((tmp_path / "one", tmp_path / "two"))["Page"] == ["one/_records.py", "two/_records.py"]
