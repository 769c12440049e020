"""The fastest model within an accuracy budget: a bisection over speed targets, judged after reconstruction.

The bisection and the ladder of targets on constructed cases (the answer known), then whole runs of a
tiny real model: the fastest target within the budget, its heads and neurons really removed, both scores
of the chosen one, and the settings it refuses.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from transformers import AutoConfig

from cahp_engine.allocation import CostModel, _target
from cahp_engine.config import PruningConfig
from cahp_engine.models import load_pruned, neurons_per_layer
from cahp_engine.run import RunHooks, RunReport, RunRequest, TargetRecord, _fastest, run_pruning
from cahp_engine.run._fastest import fastest_index, target_ladder
from tests.support.recovery import FAST, write_three_class_dataset
from tests.support.tiny_models import make_classifier, make_tokenizer


def _calls(passes):
    seen: list[int] = []

    def probe(i: int) -> bool:
        seen.append(i)
        return passes(i)

    return probe, seen


@pytest.mark.parametrize("n", [1, 2, 5, 12, 30])
def test_the_bisection_finds_the_fastest_passing_target_of_a_monotone_case(n: int) -> None:
    for last in range(-1, n):  # targets up to ``last`` pass, faster ones miss
        probe, seen = _calls(lambda i, last=last: i <= last)
        assert fastest_index(n, probe) == (None if last < 0 else last)
        assert len(seen) == len(set(seen))  # none tried twice
        if n >= 12:
            assert len(set(seen)) < n / 2


def test_a_pass_just_above_the_closing_miss_is_found() -> None:
    n = 12

    def plain(last: int) -> set[int]:  # what a plain bisection of "i <= last passes" tries
        lo, hi, seen = -1, n, set()
        while hi - lo > 1:
            mid = (lo + hi) // 2
            seen.add(mid)
            lo, hi = (mid, hi) if mid <= last else (lo, mid)
        return seen

    last = next(m for m in range(n - 2) if m + 2 not in plain(m))
    probe, seen = _calls(lambda i: i <= last or i == last + 2)
    assert fastest_index(n, probe) == last + 2 and last + 1 in seen and last + 2 in seen


def test_the_ladder_of_targets_rises_by_five_percent_up_to_the_reachable_one() -> None:
    ladder = target_ladder(2.0)
    assert ladder[0] == 1.1 and ladder[-1] == 2.0 and ladder == sorted(set(ladder))
    assert all(1.03 <= b / a <= 1.07 for a, b in zip(ladder, ladder[1:-1], strict=False))
    assert target_ladder(1.05) == [1.05]
    # x1.1 * 1.05**4 = x1.337 rounds to x1.34: above a reachable x1.3371, so the ladder stops below it.
    assert max(target_ladder(1.3371)) <= 1.3371 and target_ladder(1.3371)[-2:] == [1.27, 1.33]


# --------------------------------------------------------------------------- whole runs


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("fastest")
    make_classifier("bert", layers=2, heads=4, num_labels=3, seed=2).save_pretrained(root / "base")
    make_tokenizer().save_pretrained(root / "base")
    return root / "base", write_three_class_dataset(root / "data", {"train": (90, 0), "test": (45, 1)})


def _run(inputs, out: Path, **changes):
    lines: list[str] = []
    progress: list[tuple[str, float]] = []
    config = PruningConfig(**{**FAST, "recovery_loss": "ce", "max_accuracy_drop": 100.0, "budget_objective": "speed",
                              "recovery": "reconstruct", "target_seq_len": 16, **changes})
    report = run_pruning(RunRequest(model_ref=str(inputs[0]), dataset_ref=str(inputs[1]), output_dir=out,
                                    config=config),
                         RunHooks(log=lines.append, progress=lambda stage, overall: progress.append((stage, overall))))
    lines.extend(f"progress {stage} {overall}" for stage, overall in progress)
    return report, lines


def test_a_run_returns_the_fastest_target_within_the_budget(inputs, tmp_path: Path) -> None:
    report, lines = _run(inputs, tmp_path / "out")
    budget, target = report.budget, report.target
    assert budget is not None and budget.objective == "speed" and budget.ladder == ()
    # Within 100 points every target cut passes: the fastest of the ladder is chosen, by a bisection.
    assert budget.chosen_target == max(c.target_speedup for c in budget.candidates) == budget.targets[-1]
    assert all(c.within_budget for c in budget.candidates) and budget.skipped == ()
    assert len(budget.candidates) < len(budget.targets)
    chosen = [c for c in budget.candidates if c.chosen]
    assert len(chosen) == 1 and chosen[0].target_speedup == budget.chosen_target
    assert all(c.reconstructed is not None and c.target_speedup in budget.targets for c in budget.candidates)
    assert all(c.measured_speedup is not None and c.neurons_kept is not None for c in budget.candidates)
    # The run is that target's: the report's target record, the heads and neurons really removed.
    assert isinstance(target, TargetRecord) and target.kind == "speedup" and target.target == budget.chosen_target
    saved = load_pruned(tmp_path / "out" / report.checkpoint.path)
    assert tuple(neurons_per_layer(saved)) == target.neurons_per_layer
    assert sum(target.neurons_per_layer) == chosen[0].neurons_kept
    layers = len(target.neurons_per_layer)
    kept = sum(target.heads_per_layer) + chosen[0].neurons_kept
    units = layers * (target.heads_total + target.neurons_total)
    assert kept < units  # something was removed (which units, a tiny model's noisy latency table decides)
    assert report.summary.heads_kept == chosen[0].heads_kept == sum(target.heads_per_layer)
    # Reconstructed as the search scored it, and not trained (recovery reconstruct).
    assert report.reconstruction is not None
    cut = chosen[0].neurons_kept < layers * target.neurons_total
    assert {f.sublayer for f in report.reconstruction.fits} == ({"attention", "ffn"} if cut else {"attention"})
    assert report.recovery.steps == 0
    assert any(line.startswith("accuracy budget, the fastest model within 100 points") for line in lines)
    assert any(line.startswith(f"chosen: target x{budget.chosen_target:g}") for line in lines)
    during = [float(line.split()[-1]) for line in lines if line.startswith("progress budget ")]
    assert len(set(during)) > len(budget.candidates) // 2 and during == sorted(during)  # it moves while it tries
    written = json.loads((tmp_path / "out" / "report.json").read_text())
    assert written["budget"]["chosen_target"] == budget.chosen_target
    assert RunReport.from_dict(written).budget == budget
    from app.cli.prune import format_summary

    assert target.headline() in format_summary(report, tmp_path / "out")


def test_the_chosen_target_is_fine_tuned_when_the_recovery_says_so_and_keeps_both_scores(inputs, tmp_path) -> None:
    report, _ = _run(inputs, tmp_path / "out", recovery="reconstruct+finetune")
    budget = report.budget
    assert budget is not None and report.recovery.steps > 0
    chosen = next(c for c in budget.candidates if c.chosen)
    assert chosen.epochs == report.recovery.epochs > 0 and len(chosen.curve) > 1
    assert chosen.reconstructed is not None and chosen.curve[0].score == pytest.approx(chosen.reconstructed.score)
    assert all(c.epochs == 0 for c in budget.candidates if not c.chosen)  # the others were never trained


def test_every_target_is_cut_on_the_latency_table_the_ladder_was_drawn_from(inputs, tmp_path, monkeypatch) -> None:
    """A tiny model's latency table is too noisy to cache; a machine that timed it again for each target would
    find a lower reachable speed-up each time and put the ladder's fastest targets out of reach. The search
    fits the table once and cuts every target on it."""
    config = AutoConfig.from_pretrained(inputs[0])
    shape = {"num_layers": config.num_hidden_layers, "num_heads": config.num_attention_heads,
             "num_neurons": config.intermediate_size, "batch_size": 32, "seq_len": 16, "runtime": "pytorch",
             "points": 8, "fit_error": 0.5}
    # The first fit says x3.5 at most; every fit after it a slower fixed part, x1.74 at most.
    first, slower = (CostModel(unit="seconds", fixed=fixed, attention=0.0, head=0.0001, ffn=0.0, neuron=0.00002,
                               **shape) for fixed in (0.001, 0.004))
    fitted: list[CostModel] = []

    def noisy_machine(*_args, **_kwargs) -> CostModel:
        fitted.append(slower if fitted else first)
        return fitted[-1]

    monkeypatch.setattr(_fastest, "latency_costs", noisy_machine)
    monkeypatch.setattr(_target, "latency_costs", noisy_machine)
    report, _ = _run(inputs, tmp_path / "out")
    budget, target = report.budget, report.target
    assert len(fitted) == 1 and budget is not None and target is not None
    assert budget.targets[-1] == math.floor(first.dense / first.floor * 100) / 100 > slower.dense / slower.floor
    assert budget.skipped == () and all(c.target_speedup in budget.targets for c in budget.candidates)
    assert target.reachable_speedup == pytest.approx(first.dense / first.floor)
    assert budget.chosen_target == max(c.target_speedup for c in budget.candidates)
