"""Whole runs to a speed or FLOPs target: the allocation sizes each layer, the strategy picks its heads.

Real tiny models of two families, real runs (``run_pruning``): the neurons are really removed (the
saved checkpoint's parameter counts and shapes), the report and the log carry the per-layer heads and
neurons kept and the predicted speed-up, and an unreachable target is refused before any work.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cahp_engine.allocation import TargetUnreachableError
from cahp_engine.config import PruningConfig
from cahp_engine.errors import ConfigError
from cahp_engine.models import current_kept_heads, load_pruned, neurons_per_layer
from cahp_engine.recovery import count_parameters
from cahp_engine.run import RunHooks, RunReport, RunRequest, TargetRecord, run_pruning
from cahp_engine.run._target_stage import heads_within
from cahp_engine.selection import HeadAnalysis
from tests.support.recovery import FAST, write_three_class_dataset
from tests.support.tiny_models import make_classifier, make_tokenizer

LAYERS, HEADS = 2, 4


def _inputs(root: Path, family: str) -> tuple[Path, Path]:
    make_classifier(family, layers=LAYERS, heads=HEADS, num_labels=3, seed=2).save_pretrained(root / "base")
    make_tokenizer().save_pretrained(root / "base")
    return root / "base", write_three_class_dataset(root / "data", {"train": (90, 0), "test": (45, 1)})


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_a_flops_target_removes_heads_and_neurons_and_reports_them_per_layer(family: str, tmp_path: Path) -> None:
    model_dir, data_dir = _inputs(tmp_path, family)
    lines: list[str] = []
    heard: list[object] = []  # the stages as they start, and the target's record when the hook hears it

    def stage(name: str, _fraction: float) -> None:
        if not heard or heard[-1] != name:
            heard.append(name)

    config = PruningConfig(**{**FAST, "target_flops": 0.4, "target_seq_len": 16, "recovery": "reconstruct"})
    report = run_pruning(RunRequest(str(model_dir), str(data_dir), tmp_path / "out", config),
                         RunHooks(log=lines.append, progress=stage, target_decided=heard.append))

    target = report.target
    assert isinstance(target, TargetRecord) and target.kind == "flops" and target.target == 0.4
    assert target.flops_kept <= 0.4 and target.predicted_speedup >= 2.5 and target.measured_speedup is None
    assert len(target.heads_per_layer) == len(target.neurons_per_layer) == LAYERS
    # The hook heard the record once, as soon as the surgery had pruned to it, before reconstruction.
    assert [item for item in heard if isinstance(item, TargetRecord)] == [target]
    assert heard.index("surgery") < heard.index(target) < heard.index("reconstruction")
    assert sum(target.neurons_per_layer) < LAYERS * target.neurons_total
    # The checkpoint really lost those neurons and heads: its shapes and its parameter count.
    saved = load_pruned(tmp_path / "out" / report.checkpoint.path)
    assert tuple(neurons_per_layer(saved)) == target.neurons_per_layer
    assert tuple(len(h) for h in current_kept_heads(saved)) == target.heads_per_layer
    assert count_parameters(saved).total == report.parameters.pruned.total < report.parameters.dense.total
    # The report's selection and head map are the heads the target kept, chosen by CAHP within the counts.
    assert report.selection.strategy == "cahp" and report.selection.knee_found is None
    assert tuple(len(report.selection.kept[layer]) for layer in range(LAYERS)) == target.heads_per_layer
    written = json.loads((tmp_path / "out" / "report.json").read_text())
    assert written["target"]["neurons_per_layer"] == list(target.neurons_per_layer)
    assert RunReport.from_dict(written).target == target
    assert (tmp_path / "out" / "layer_units.png").stat().st_size > 0  # the map beside the head map
    head_map = json.loads((tmp_path / "out" / "head_map.json").read_text())
    assert [len(head_map["kept"][str(layer)]) for layer in range(LAYERS)] == list(target.heads_per_layer)
    # Reconstruction refit the feed-forward blocks too, and the log shows the table.
    assert report.reconstruction is not None
    assert {fit.sublayer for fit in report.reconstruction.fits} == {"attention", "ffn"}
    assert any(line.startswith("FLOPs target 0.4: kept") for line in lines)
    card = (tmp_path / "out" / report.checkpoint.path / "README.md").read_text()
    assert "FLOPs target 0.4: kept" in card and "feed-forward neurons per layer [" in card
    assert "attention and feed-forward output projections of each layer refit" in card
    assert "| layer | heads kept | original indices | feed-forward neurons kept |" in card
    assert f"| 0 | {target.heads_per_layer[0]} / {HEADS} |" in card and "Kneedle" not in card
    header = f"layer  heads (of {HEADS})  neurons (of {target.neurons_total})"
    assert any(line.strip() == header for line in lines)
    from app.cli.prune import format_summary

    summary = format_summary(report, tmp_path / "out")
    assert target.headline() in summary and f"    {header}" in summary
    assert f"  {sum(target.heads_per_layer)} heads chosen within the target's per-layer counts (the knees, " \
           "not used: d2=" in summary


def test_a_target_beyond_what_the_flops_allow_is_refused_before_any_work(tmp_path: Path) -> None:
    model_dir, data_dir = _inputs(tmp_path, "bert")
    lines: list[str] = []
    with pytest.raises(TargetUnreachableError) as err:
        run_pruning(RunRequest(str(model_dir), str(data_dir), tmp_path / "out",
                               PruningConfig(**{**FAST, "target_speedup": 900.0, "target_seq_len": 16})),
                    RunHooks(log=lines.append))
    assert err.value.code == "target_unreachable" and err.value.best > 1
    assert "`target_speedup` 900 is beyond what this model reaches" in str(err.value)
    assert "ask for at most" in str(err.value) and "counted in FLOPs before any work" in str(err.value)
    assert not any("dense fine-tuning" in line for line in lines)  # refused at load, before any training
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_an_unreachable_target_at_the_p95_length_names_the_bound_at_any_length(tmp_path: Path) -> None:
    model_dir, data_dir = _inputs(tmp_path, "bert")
    with pytest.raises(TargetUnreachableError) as err:
        run_pruning(RunRequest(str(model_dir), str(data_dir), tmp_path / "out",
                               PruningConfig(**{**FAST, "target_speedup": 900.0, "target_seq_len": "p95"})),
                    RunHooks(log=lambda _line: None))
    message = str(err.value)
    assert "beyond what this model reaches at batch 32 and any serving length in FLOPs" in message, message
    assert f"at most x{err.value.best:.2f}, keeping one head" in message and "ask for at most" in message
    assert "x 1 tokens" not in message and "analytic" not in message
    assert "the p95 length is read from the data later" in message


@pytest.mark.parametrize(("changes", "message"), [
    ({"target_speedup": 0.5}, "`target_speedup` must be a number in [1.0, 1000.0], got 0.5"),
    ({"target_flops": 0.0}, "`target_flops` must be a number in (0.0, 1.0], got 0.0"),
    ({"target_flops": 1.5}, "`target_flops` must be a number in (0.0, 1.0], got 1.5"),
    ({"target_speedup": 2.0, "heads_to_keep": 4}, "`target_speedup` decides how many heads each layer keeps"),
    ({"target_flops": 0.5, "max_accuracy_drop": 1.0}, "`target_flops` fixes the model's size and "
                                                       "`max_accuracy_drop` searches for it; for the fastest model"),
    ({"budget_objective": "speed", "recovery": "reconstruct"},
     "`budget_objective` 'speed' looks for the fastest model within an accuracy budget; set `max_accuracy_drop`"),
    ({"budget_objective": "speed", "max_accuracy_drop": 1.0, "recovery": "reconstruct", "target_flops": 0.5},
     "`budget_objective` 'speed' searches for the speed target and `target_flops` fixes it"),
    ({"budget_objective": "speed", "max_accuracy_drop": 1.0, "recovery": "finetune"},
     "judges its candidates after layer-wise reconstruction; set `recovery`"),
    ({"target_speedup": 2.0, "target_flops": 0.5}, "`target_speedup` and `target_flops` each set the size"),
    ({"target_runtime": "tensorrt"}, "`target_runtime` must be one of pytorch, ort-fp32, ort-int8, got 'tensorrt'"),
    ({"target_seq_len": "p90"}, "`target_seq_len` must be an integer between 1 and 8192 or 'p95', got 'p90'"),
])
def test_bad_targets_are_refused_with_what_to_change(changes: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        PruningConfig(**changes)
    assert message in str(err.value)


def _analysis_like(salience: np.ndarray, labels: np.ndarray) -> HeadAnalysis:
    """A HeadAnalysis stand-in exposing what :func:`heads_within` reads for ``cahp``: shape, salience, labels."""

    class _Analysis:
        shape = salience.shape

        def __init__(self) -> None:
            self.salience = salience

        def labels(self, k: int) -> np.ndarray:
            return labels

    return _Analysis()  # type: ignore[return-value]


def test_cahp_fills_each_layers_count_with_complementary_heads_first() -> None:
    salience = np.array([[0.9, 0.8, 0.1, 0.2], [0.5, 0.4, 0.3, 0.6]])
    labels = np.array([0, 0, 1, 2, 3, 3, 1, 2])
    kept = heads_within(_analysis_like(salience, labels), "cahp", [2, 1], seed=0)
    # Layer 0's second head is head 2, the one of cluster 1 (kept nowhere else), not head 1 (cluster 0, which
    # head 0 represents) nor head 3 (cluster 2, which layer 1's head 3 represents).
    assert kept == [[0, 2], [3]]
    # A count every head of a layer fills keeps that layer whole; the counts are always honoured.
    assert heads_within(_analysis_like(salience, labels), "cahp", [4, 2], seed=0) == [[0, 1, 2, 3], [0, 3]]
