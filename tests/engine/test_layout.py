"""The engine's shape: small modules, light modules that load no torch, public names that stay."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "cahp_engine"
#: Modules the command line and the job service import to build parsers and schemas.
LIGHT = ("cahp_engine", "cahp_engine.config", "cahp_engine.dataset_options", "cahp_engine.strategies",
         "cahp_engine.report", "cahp_engine.results", "cahp_engine._validation", "cahp_engine.errors",
         "cahp_engine.progress")
HEAVY = ("torch", "transformers", "numpy", "scipy", "sklearn", "datasets", "pyarrow", "matplotlib")


def test_no_engine_module_is_over_450_lines():
    long = {str(p.relative_to(ROOT)): n for p in ENGINE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 450}
    assert long == {}


@pytest.mark.parametrize("module", LIGHT)
def test_light_modules_load_no_torch_numpy_or_transformers(module):
    code = f"import sys, {module}\nprint(','.join(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == ""


@pytest.mark.parametrize(
    ("module", "names"),
    [
        ("cahp_engine", ("PruningConfig", "load_pruned", "save_pruned", "prune_heads", "select_heads", "run_pruning",
                         "load_classifier", "load_splits", "analyze_heads", "choose", "RunReport")),
        ("cahp_engine.data", ("encode",)),
        ("cahp_engine.run", ("ARTIFACT_FILES", "STAGE_SPAN", "run_pruning", "resolve_device", "prepare_output_dir")),
        ("cahp_engine.datasets_io", ("DatasetOptions", "DatasetSplits", "FILE_SUFFIXES", "DEFAULT_EVAL_SPLITS",
                                     "DATASET_OPTION_FIELDS", "SPLIT_NAME", "check_split_name", "load_splits")),
        ("cahp_engine.checkpoint", ("check_weight_files", "load_pruned", "save_pruned")),
        ("cahp_engine.config", ("PruningConfig", "REPORTED_DEGREES", "STRATEGIES", "DENSE_FINETUNE_MODES",
                                "parse_device")),
        ("cahp_engine.evaluation", ("evaluate", "count_parameters", "compare_speed", "measure_latency",
                                    "model_inputs", "as_device", "ClassificationMetrics", "ParameterCounts",
                                    "Latency")),
        ("cahp_engine.training", ("finetune", "TrainingResult")),
        ("cahp_engine.pipeline", ("select_heads", "SelectionResult")),
    ],
)
def test_public_names_stay_importable(module, names):
    loaded = importlib.import_module(module)
    assert [n for n in names if not hasattr(loaded, n)] == []
