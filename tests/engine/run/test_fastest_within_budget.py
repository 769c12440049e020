"""The fastest model within an accuracy budget: a bisection over speed targets, judged after reconstruction.

The bisection and the ladder of targets on constructed cases (the answer known), then whole runs of a
tiny real model: the fastest target within the budget, its heads and neurons really removed, both scores
of the chosen one, and the settings it refuses.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from transformers import AutoConfig

from cahp_engine.allocation import CostModel, _target
from cahp_engine.config import PruningConfig
from cahp_engine.errors import AccuracyBudgetError
from cahp_engine.models import load_pruned, neurons_per_layer
from cahp_engine.run import RunHooks, RunReport, RunRequest, TargetRecord, _fastest, _steps, run_pruning
from cahp_engine.run._fastest import fastest_index, lifted_index, target_ladder
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


class _Lift:
    """Targets whose reconstructed score falls by ``step`` a target from ``top``; fine-tuning adds ``gain``."""

    def __init__(self, n: int, *, top: float, step: float, gain: float, threshold: float) -> None:
        self.reconstructed = [top - step * i for i in range(n)]
        self.gain, self.threshold = gain, threshold
        self.probed: list[int] = []
        self.scored: set[int] = set()

    def found(self) -> int | None:
        return max((i for i, r in enumerate(self.reconstructed) if r >= self.threshold), default=None)

    def predicted(self, i: int, margin: float) -> bool:
        self.scored.add(i)
        return self.reconstructed[i] + margin >= self.threshold

    def probe(self, i: int, _margin: float | None) -> tuple[bool, float | None]:
        assert i not in self.probed  # never probed twice
        self.probed.append(i)
        if self.reconstructed[i] >= self.threshold:
            return True, None  # met before training: no gain measured
        return self.reconstructed[i] + self.gain >= self.threshold, self.gain


@pytest.mark.parametrize("gain", [0.0, 0.004, 0.012, 0.03, 0.2])
def test_fine_tuning_probes_find_the_fastest_target_that_passes_once_fine_tuned(gain: float) -> None:
    n = 20
    case = _Lift(n, top=0.80, step=0.004, gain=gain, threshold=0.77)
    found = case.found()
    assert found == 7  # 0.80 - 7 * 0.004 = 0.772
    answer = lifted_index(n, found, case.predicted, case.probe)
    truth = max(i for i in range(n) if case.reconstructed[i] + gain >= case.threshold)
    assert answer == truth
    assert case.probed[0] == found + 1  # the first probe measures the gain just above the last pass
    if gain == 0.0:
        assert case.probed == [found + 1]  # fine-tuning adds nothing: one probe, and the answer stands
    assert len(case.probed) <= 3  # a constant gain is learnt by the first probe


def test_with_no_target_passing_after_reconstruction_the_slowest_is_probed_first() -> None:
    case = _Lift(10, top=0.70, step=0.01, gain=0.05, threshold=0.72)
    assert case.found() is None
    assert lifted_index(10, None, case.predicted, case.probe) == 3  # 0.70 - 0.03 + 0.05 = 0.72
    assert case.probed[0] == 0
    short = _Lift(10, top=0.70, step=0.01, gain=0.01, threshold=0.72)
    assert lifted_index(10, None, short.predicted, short.probe) is None and short.probed == [0]


def test_the_probes_stop_where_the_fastest_target_already_passed() -> None:
    case = _Lift(6, top=0.9, step=0.01, gain=0.05, threshold=0.5)
    assert lifted_index(6, case.found(), case.predicted, case.probe) == 5 and case.probed == []


def test_a_noisy_gain_is_read_as_the_median_of_the_probes() -> None:
    """Gains 0.05, then 0.0 at the target it predicted: the median (0.025) predicts the next probe."""
    gains = iter([0.05, 0.0, 0.0, 0.0, 0.0])
    reconstructed = [0.80 - 0.01 * i for i in range(12)]

    def probe(i: int, _margin: float | None) -> tuple[bool, float | None]:
        gain = next(gains)
        return reconstructed[i] + gain >= 0.78, gain

    seen: list[tuple[int, float]] = []

    def predicted(i: int, margin: float) -> bool:
        seen.append((i, margin))
        return reconstructed[i] + margin >= 0.78

    assert lifted_index(12, 2, predicted, probe) == 3  # the first probe (3) passed with 0.05; 7 missed
    assert {m for _, m in seen} == {0.05, 0.025}


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


@pytest.fixture(autouse=True)
def steady_machine(request, monkeypatch) -> None:
    """Whole runs read one latency table (x3.5 at most), not this machine's timing of a tiny model: that is
    overhead and noise, and on a fast processor it leaves a single target on the ladder."""
    if "inputs" not in request.fixturenames:
        return
    config = AutoConfig.from_pretrained(request.getfixturevalue("inputs")[0])
    table = CostModel(unit="seconds", fixed=0.001, attention=0.0, head=0.0001, ffn=0.0, neuron=0.00002,
                      num_layers=config.num_hidden_layers, num_heads=config.num_attention_heads,
                      num_neurons=config.intermediate_size, batch_size=32, seq_len=16, runtime="pytorch", points=8,
                      fit_error=0.05)
    monkeypatch.setattr(_fastest, "latency_costs", lambda *_args, **_kwargs: table)
    monkeypatch.setattr(_target, "latency_costs", lambda *_args, **_kwargs: table)


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


def test_a_target_short_after_reconstruction_is_fine_tuned_before_the_search_gives_up(inputs, tmp_path,
                                                                                    monkeypatch) -> None:
    """A threshold above every score (the inputs' own, raised past 100 %): no target passes after
    reconstruction, so the search fine-tunes the slowest one to learn what fine-tuning adds; it misses too,
    and the run fails with that probe in its record: really reconstructed and trained, both scores kept."""
    search_inputs = _steps.search_inputs

    def unreachable(*args, **kwargs):
        return dataclasses.replace(search_inputs(*args, **kwargs), threshold=1.01)

    monkeypatch.setattr(_steps, "search_inputs", unreachable)
    with pytest.raises(AccuracyBudgetError) as failed:
        _run(inputs, tmp_path / "out", recovery="reconstruct+finetune", epochs=2, budget_screen_epochs=1)
    budget = failed.value.budget
    assert budget is not None and budget.chosen_target is None
    probed = [c for c in budget.candidates if c.epochs > 0]
    assert len(probed) == 1 and probed[0].target_speedup == budget.targets[0]  # the slowest, and no other
    probe = probed[0]
    assert probe.epochs == 1.0 and len(probe.curve) >= 2 and not probe.within_budget
    assert probe.reconstructed is not None and probe.curve[0].score == pytest.approx(probe.reconstructed.score)
    assert probe.stopped in ("paused", "cannot_reach") and "to measure what fine-tuning adds" in probe.reason
    assert budget.epochs_trained == 1.0 and budget.cost_vs_single_run is not None
    assert all(c.epochs == 0 for c in budget.candidates if c is not probe)


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
