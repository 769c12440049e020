"""The engine is a pure library: it must not know there is a service."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {"app", "worker", "fastapi", "celery", "sqlalchemy", "alembic", "redis", "kombu", "boto3"}


def test_engine_source_imports_no_service_layer():
    offenders = []
    for path in (ROOT / "cahp_engine").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in FORBIDDEN]
    assert offenders == []


def test_importing_the_engine_loads_no_service_module():
    code = (
        "import sys, importlib, pkgutil, cahp_engine\n"
        "for m in pkgutil.iter_modules(cahp_engine.__path__):\n"
        "    if m.name == '__main__': continue\n"
        "    importlib.import_module('cahp_engine.' + m.name)\n"
        f"bad = sorted(n for n in sys.modules if n.split('.')[0] in {sorted(FORBIDDEN)!r})\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == ""
