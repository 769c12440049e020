"""A fresh golden run writes what the code wrote before the refactor (timings, dates and speed aside).

The committed files under ``tests/engine/golden/`` come from ``python -m tests.engine.golden.make_golden``
run on the code before the run report became typed and head selection a registry of strategies, and
were regenerated when the defaults changed on purpose (perplexity 10, variance floor
1e-6, sampling with stopping rules, random calibration batch order, the stability measure).
This test runs the same thing now and compares: the same keys in the same order everywhere, the
same selection (kept heads, k*, knees, representatives, layer-safety heads, cluster labels, salience
to 1e-9) and the same values otherwise, except wall times, dates, the environment and the measured
latencies, which no two runs share.

The files were regenerated once since, when the report gained ``export`` and the summary and the
settings their ONNX fields (the golden run sets ``export="none"``); the selection, metrics,
parameters, head map, curve and the selections of every strategy were checked identical to the
first generation before the new files were committed.

When the report gained ``identity``, ``recipe`` and ``quality``, the summary its macro-F1, ONNX and
int8 figures, speed-up intervals and warnings, and the run one latency measurement (``export.speed``
holds it even with ``export="none"``; latencies their p25/p75), those keys were added to the committed
report from a fresh pinned run, after every value already there compared equal to that run (the stage
timings' names aside, which had changed with the evaluation before recovery).

Floats are compared to a relative 1e-9: the run is deterministic on one machine (two runs give
byte-identical selections). Across machines it is so only with the CPU code paths pinned
(``make_golden.PINNED_ENV``): unpinned, an AVX-512 machine and an AMD EPYC without it gave salience
differing in the 8th digit and, through t-SNE, other knees. Pinned, an Intel Xeon with AMX and
AVX512-FP16 (2026-12-02) still gave raw salience 7e-10 apart from the AMD EPYC that wrote the files,
losses apart in the 8th digit, MSS values apart by up to 4e-3 and another t-SNE layout and
leave-one-shard-out record, with the same kept heads, k*, knees, clusters and selections of every
strategy; so the values that processor arithmetic reaches (:data:`PROCESSOR`) are compared within a
tolerance or by shape only, and the selection itself exactly. The files were regenerated pinned on
2026-12-01 from the commit before the recovery gained distillation, and the head map, curve and
selections checked identical to a pinned run of that commit. They were regenerated once more for
that recovery (distillation by default, per-class recall, the budget's settings and record):
head map, curve, selections and the report's selection were identical, and so were the pruned
model's accuracy and confusion matrix after the distilled recovery. When the consensus strategies came,
the report's selection and the head map gained a `consensus` key, null for CAHP: it was added to the
files by hand, and a fresh run checked to write the same selection, head map, curve and selections.
The settings' ``budget_parallel`` (1, the bisection the files were made with) was added by hand too.
So was the quality record's ``drop_metric`` (``accuracy``: the golden run sets no budget), and the
settings' ``budget_objective`` (``heads``, the only objective when the files were made).
The sampling records' ``checkpoints`` (the row counts the stopping rule looked at; empty here) were renamed
``rungs`` by hand, the name the report has used since, and "checkpoint" became "rung" in their ``reason``.
Regenerate the files only from a commit whose behaviour is the reference.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.engine.golden.make_golden import FILES, HERE, PINNED_ENV

ROOT = Path(__file__).resolve().parents[3]

#: Values that change from run to run; their keys and list lengths are still compared.
VOLATILE = tuple(re.compile(p) for p in (
    r"^report\.json\.created_at$",
    r"^report\.json\.wall_time_s$",
    r"^report\.json\.timings_s\.[a-z_]+$",
    r"^report\.json\.selection\.stability\.seconds$",
    r"^report\.json\.environment\..*$",
    r"^report\.json\.summary\.speedup(_low|_high)?$",
    r"^report\.json\.speed\.results\[\d+\]\.(dense|pruned)\.(p50_ms|p95_ms|p25_ms|p75_ms|mean_ms|throughput_per_s)$",
    r"^report\.json\.speed\.results\[\d+\]\.speedup(_low|_high)?$",
    # The run's one latency measurement (with export "none": the two PyTorch models, in interleaved rounds).
    r"^report\.json\.export\.speed\.results\[\d+\]\.(latency\.[a-z_]+\.(p50_ms|p95_ms|p25_ms|p75_ms|mean_ms|"
    r"throughput_per_s)|speedup\.[a-z_]+|speedup_low\.[a-z_]+|speedup_high\.[a-z_]+)$",
    r"^report\.json\.export\.speed\.runtimes\.[a-z_]+$",
    r"^report\.json\.(recovery|dense_finetune\.training)\.(wall_s|seconds_per_epoch\[\d+\])$",
    r"^report\.json\.recovery\.teacher\.seconds$",
))
#: Values that the processor's arithmetic reaches: pinned paths leave float32 sums in another order on
#: some processors (an Intel Xeon with AMX and AVX512-FP16 against the AMD EPYC that wrote the files:
#: raw salience 7e-10 apart), and t-SNE turns that into another layout of the same clusters. Their
#: keys and lengths are compared everywhere; their values within the (relative, absolute) tolerance
#: given, or not at all (None).
PROCESSOR: tuple[tuple[re.Pattern[str], tuple[float, float] | None], ...] = tuple((re.compile(p), tol) for p, tol in (
    (r"^(head_map\.json|selections\.json\[\d+\])\.salience(_raw)?\[", (0.0, 1e-6)),  # on the [0, 1] scale
    (r"^report\.json\.(recovery|dense_finetune\.training)\.loss_per_epoch\[", (1e-6, 0.0)),
    (r"^mss_curve\.json\.mss\[", (0.0, 1e-2)),  # the knees themselves are compared exactly
    (r"^head_map\.json\.graph_space\[", None),
    (r"^head_map\.json\.kept_frequency\[", None),
    (r"^report\.json\.selection\.stability\.(mean_jaccard|min_jaccard|jaccard_to_selection|k_stars|"
     r"heads_kept|kept_frequency)", None),
))
#: Every other float: the run is deterministic on one machine.
FLOAT_TOLERANCE = (1e-9, 1e-12)


def _differences(golden: Any, fresh: Any, where: str) -> list[str]:
    if any(p.match(where) for p in VOLATILE):
        return []
    if isinstance(golden, dict):
        if not isinstance(fresh, dict) or list(golden) != list(fresh):
            return [f"{where}: keys {list(golden)} became {list(fresh) if isinstance(fresh, dict) else fresh!r}"]
        return [d for key in golden for d in _differences(golden[key], fresh[key], f"{where}.{key}")]
    if isinstance(golden, list):
        if not isinstance(fresh, list) or len(golden) != len(fresh):
            return [f"{where}: {golden!r:.200} became {fresh!r:.200}"]
        pairs = enumerate(zip(golden, fresh, strict=True))
        return [d for i, (a, b) in pairs for d in _differences(a, b, f"{where}[{i}]")]
    if type(golden) is not type(fresh):
        return [f"{where}: {golden!r} ({type(golden).__name__}) became {fresh!r} ({type(fresh).__name__})"]
    matched = [tol for pattern, tol in PROCESSOR if pattern.match(where)]
    if matched and matched[0] is None:
        return []
    tolerance = matched[0] if matched else FLOAT_TOLERANCE if isinstance(golden, float) else None
    if tolerance is None:
        return [] if golden == fresh else [f"{where}: {golden!r} became {fresh!r}"]
    relative, absolute = tolerance
    close = math.isclose(golden, fresh, rel_tol=relative, abs_tol=absolute)
    return [] if close else [f"{where}: {golden!r} became {fresh!r}"]


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("golden")
    env = {**os.environ, **PINNED_ENV, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "tests.engine.golden.make_golden", "--out", str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", FILES)
def test_a_fresh_run_writes_what_the_code_wrote_before_the_refactor(fresh: Path, name: str) -> None:
    golden = json.loads((HERE / name).read_text())
    now = json.loads((fresh / name).read_text())
    assert _differences(golden, now, name) == []


def test_the_comparison_sees_a_changed_selection_and_a_reordered_key() -> None:
    golden = json.loads((HERE / "report.json").read_text())
    moved = {**golden, "selection": {**golden["selection"], "k_star": golden["selection"]["k_star"] + 1}}
    assert _differences(golden, moved, "report.json") == [
        f"report.json.selection.k_star: {golden['selection']['k_star']} became {golden['selection']['k_star'] + 1}"]
    reordered = {"summary": golden["summary"], **{k: v for k, v in golden.items() if k != "summary"}}
    assert len(_differences(golden, reordered, "report.json")) == 1
    later = {**golden, "created_at": "2030-01-01T00:00:00+00:00", "timings_s": dict.fromkeys(golden["timings_s"], 9.0)}
    assert _differences(golden, later, "report.json") == []


def test_the_processor_tolerances_are_narrow() -> None:
    heads = json.loads((HERE / "head_map.json").read_text())
    first = heads["salience"][0][0]
    rounding = {**heads, "salience": [[first + 5e-7, *heads["salience"][0][1:]], *heads["salience"][1:]]}
    assert _differences(heads, rounding, "head_map.json") == []
    moved = {**heads, "salience": [[first + 1e-4, *heads["salience"][0][1:]], *heads["salience"][1:]]}
    assert _differences(heads, moved, "head_map.json") == [
        f"head_map.json.salience[0][0]: {first!r} became {first + 1e-4!r}"]
    # Another t-SNE layout is tolerated, a layout of another size is not.
    elsewhere = {**heads, "graph_space": [[0.0, 0.0]] * len(heads["graph_space"])}
    assert _differences(heads, elsewhere, "head_map.json") == []
    assert len(_differences(heads, {**heads, "graph_space": heads["graph_space"][:-1]}, "head_map.json")) == 1
    curve = json.loads((HERE / "mss_curve.json").read_text())
    shifted = {**curve, "mss": [m + 0.05 for m in curve["mss"]]}
    assert len(_differences(curve, shifted, "mss_curve.json")) == len(curve["mss"])
