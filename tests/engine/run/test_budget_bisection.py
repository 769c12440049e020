"""The accuracy budget judged after reconstruction scores a bisection of the ladder, not all of it.

The ladder is a real one (a tiny random model's analysis, CAHP's and salience top-k's choices); the
scores are constructed where the test needs to know the answer (a monotone case, a dip next to the
bracket), and real (reconstruction and validation) in the runs, which also resume from the scores an
earlier attempt kept.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

import pytest
import torch

from cahp_engine.config import PruningConfig
from cahp_engine.data import LabelledTexts, encode
from cahp_engine.recovery import classification_metrics, predict
from cahp_engine.results import ValidationPoint
from cahp_engine.run import DirectoryResumeStore, RunHooks, RunRequest, SearchInputs, run_pruning
from cahp_engine.run._budget import ladder
from cahp_engine.run._candidates import CandidateResult
from cahp_engine.run._judged import _fine_tune_probes
from cahp_engine.run._scoring import LazyScores, every_step
from cahp_engine.selection import Selection, analyze_heads
from tests.support.recovery import FAST, write_three_class_dataset
from tests.support.tiny_models import make_classifier, make_texts, make_tokenizer

STRATEGIES = ("cahp", "salience")


def _encoded(n: int, seed: int):
    texts, labels = make_texts(n, num_classes=3, seed=seed)
    return encode(make_tokenizer(), LabelledTexts(tuple(texts), labels, ("a", "b", "c")), max_length=32)


@pytest.fixture(scope="module")
def setup():
    """A real ladder (4 layers of 4 heads) and the search inputs a constructed score is judged with."""
    model = make_classifier("bert", layers=4, heads=4, seed=1)
    config = PruningConfig(resolution=6, seed=5, max_accuracy_drop=1.0, recovery="reconstruct",
                           budget_strategies=STRATEGIES)
    steps = ladder(analyze_heads(model, _encoded(60, 3), config), STRATEGIES, seed=5)
    validation = _encoded(30, 2)
    predictions = predict(model, validation, batch_size=16)
    metrics = classification_metrics(validation.labels, predictions, 3)
    inputs = SearchInputs(dense=model, train=validation, validation=validation, dense_validation=metrics,
                          dense_predictions=predictions, teacher=None, class_weights=None, config=config,
                          device=torch.device("cpu"), threshold=0.5)
    return steps, inputs


def _constructed(inputs: SearchInputs, score_of):
    """A scorer whose score is ``score_of(strategy, heads)``; the calls it answered, in order."""
    calls: list[tuple[str, int]] = []

    def score(strategy: str, selection: Selection):
        calls.append((strategy, selection.num_kept))
        value = float(score_of(strategy, selection.num_kept))
        point = ValidationPoint(step=0, epoch=0.0, score=value, accuracy=value, macro_f1=value)
        return point, inputs.dense_predictions, None

    return score, calls


def _full_scan(steps, score_of, threshold: float) -> int | None:
    """The fewest-heads step where some strategy's candidate reaches ``threshold``: every candidate scored."""
    passing = [i for i, step in enumerate(steps) for name, sel in step.options
               if score_of(name, sel.num_kept) >= threshold]
    return min(passing, default=None)


def test_the_ladder_is_long_enough_to_bisect(setup) -> None:
    steps, _ = setup
    assert len(steps) >= 5 and every_step(steps) > len(steps)
    assert [s.heads for s in steps] == sorted(s.heads for s in steps)


def test_a_monotone_score_gets_the_full_ladders_answer_from_fewer_candidates(setup) -> None:
    steps, inputs = setup
    total = steps[-1].heads + 1

    def score_of(strategy: str, heads: int) -> float:
        return heads / total - (0.03 if strategy == "salience" else 0.0)  # rises with the head count

    for threshold in sorted({score_of("cahp", s.heads) - 1e-6 for s in steps} | {0.0, 2.0}):
        case = SearchInputs(**{**inputs.__dict__, "threshold": threshold})
        score, calls = _constructed(case, score_of)
        lazy = LazyScores(steps, case, say=lambda _line: None, score=score)
        found = lazy.first(-1, len(steps), lambda j: j.meets)
        assert found == _full_scan(steps, score_of, threshold)
        assert len(calls) == len(set(calls)) < every_step(steps)  # fewer, and none scored twice
        assert len(lazy.path) == len(calls)
        skipped = lazy.skipped(found)
        assert len(skipped) + len(calls) == every_step(steps)
        assert all(s.reason.startswith("not scored: ") for s in skipped)


def test_a_dip_next_to_the_bracket_is_looked_at_and_searched_below(setup) -> None:
    steps, inputs = setup

    def probes(m: int) -> set[int]:  # what a plain bisection of "step >= m passes" scores
        lo, hi, seen = -1, len(steps), set()
        while hi - lo > 1:
            mid = (lo + hi) // 2
            seen.add(mid)
            lo, hi = (lo, mid) if mid >= m else (mid, hi)
        return seen

    m = next(m for m in range(2, len(steps)) if m - 2 not in probes(m))
    # Every count from step m passes, m - 1 misses, m - 2 passes again: not monotone next to the bracket,
    # where the bisection alone would not look.
    passing = {steps[i].heads for i in range(m, len(steps))} | {steps[m - 2].heads}

    def score_of(_strategy: str, heads: int) -> float:
        return 1.0 if heads in passing else 0.0

    case = SearchInputs(**{**inputs.__dict__, "config": inputs.config.replace(budget_strategies=("cahp",))})
    score, calls = _constructed(case, score_of)
    lazy = LazyScores(steps, case, say=lambda _line: None, score=score)
    assert lazy.first(-1, len(steps), lambda j: j.meets) == m - 2
    assert ("cahp", steps[m - 1].heads) in calls and ("cahp", steps[m - 2].heads) in calls
    assert lazy.path[-1].note.startswith("the step below cahp's miss")


class _GainingExecutor:
    """Fine-tunes nothing: a candidate's recovered score is its constructed score plus ``gain``, reached after one
    epoch, or at once when the constructed score already meets the budget (as recovery stops there)."""

    def __init__(self, inputs: SearchInputs, score_of, gain: float) -> None:
        self.inputs, self.score_of, self.gain, self.trained, self.probes = inputs, score_of, gain, [], []

    def run(self, pieces, inputs):
        out = []
        for spec in pieces:
            heads = sum(len(h) for h in spec.kept.values())
            self.probes.append((spec.strategy, heads, spec.until_epochs))
            before = float(self.score_of(spec.strategy, heads))
            met_before = before >= inputs.threshold
            after = before if met_before else before + self.gain
            if not met_before:
                self.trained.append(heads)
            best = ValidationPoint(step=0, epoch=0.0 if met_before else 1.0, score=after, accuracy=after,
                                   macro_f1=after)
            met = after >= inputs.threshold
            out.append(CandidateResult(spec=spec, status="within_budget" if met else "completed", reason="constructed",
                                       curve=(best,), best=best, epochs=0.0 if met_before else 1.0, seconds=0.0,
                                       drop=inputs.drop(inputs.dense_predictions), run=None))
        return out

    def release(self, spec) -> None:
        pass


def test_fine_tuning_probes_below_a_reconstructed_winner_to_learn_what_it_adds(setup) -> None:
    steps, inputs = setup
    total = steps[-1].heads + 1

    def score_of(_strategy: str, heads: int) -> float:
        return heads / total

    # Reconstructed, only the top steps pass; fine-tuning adds enough to carry two steps more over the line.
    frontier = len(steps) - 2
    threshold = score_of("cahp", steps[frontier].heads) - 1e-6
    gain = score_of("cahp", steps[frontier].heads) - score_of("cahp", steps[frontier - 2].heads) + 1e-3
    case = SearchInputs(**{**inputs.__dict__, "threshold": threshold,
                           "config": inputs.config.replace(budget_strategies=("cahp",),
                                                           recovery="reconstruct+finetune")})
    score, _ = _constructed(case, score_of)
    said: list[str] = []
    lazy = LazyScores(steps, case, say=said.append, score=score)
    executor = _GainingExecutor(case, score_of, gain)
    winner = _fine_tune_probes(lazy, executor)
    assert winner is not None
    # The first probe met the budget as reconstructed and trained nothing; the search did not stop there.
    assert winner.step == frontier - 2 and winner.selection.num_kept == steps[frontier - 2].heads
    assert executor.trained and steps[frontier - 1].heads in executor.trained
    assert any(line.startswith("no probe has trained yet") for line in said)


def _with_knee(steps, at: int):
    return [dataclasses.replace(step, knee=i == at) for i, step in enumerate(steps)]


@pytest.fixture
def knee_setup(setup):
    """The ladder with its middle step as the knee: steps, inputs, the knee's step, and one more than the most heads."""
    steps, inputs = setup
    knee = len(steps) // 2
    return _with_knee(steps, knee), inputs, knee, steps[-1].heads + 1


def _probing(inputs: SearchInputs, **changes) -> SearchInputs:
    config = inputs.config.replace(**{"recovery": "reconstruct+finetune", "epochs": 3.0, "budget_screen_epochs": 0.5,
                                      **changes})
    return SearchInputs(**{**inputs.__dict__, "config": config})


def _probed(steps, case: SearchInputs, score_of, gain: float):
    """The probes' search over ``steps`` with a constructed score and fine-tuning: winner, scores asked, probes, log."""
    score, calls = _constructed(case, score_of)
    said: list[str] = []
    lazy = LazyScores(steps, case, say=said.append, score=score)
    executor = _GainingExecutor(case, score_of, gain)
    return _fine_tune_probes(lazy, executor), calls, executor.probes, said


def test_the_knee_is_probed_first_for_the_protocol_and_a_winning_knee_needs_no_other_probe(knee_setup) -> None:
    steps, inputs, knee, total = knee_setup

    def score_of(strategy: str, heads: int) -> float:
        return heads / total - (0.2 if strategy == "salience" else 0.0)

    # Reconstructed, the knee misses by a little; fine-tuning carries it over, and no fewer heads.
    gain = 0.5 * (score_of("cahp", steps[knee].heads) - score_of("cahp", steps[knee - 1].heads))
    case = SearchInputs(**{**_probing(inputs, budget_strategies=("cahp",)).__dict__,
                           "threshold": score_of("cahp", steps[knee].heads) + 0.5 * gain})
    winner, calls, probes, said = _probed(steps, case, score_of, gain)
    assert winner is not None and winner.step == knee
    assert calls[0] == ("cahp", steps[knee].heads)  # scored first: the knee
    assert probes == [("cahp", steps[knee].heads, 3.0)]  # one probe, for the whole protocol
    assert any(line.startswith("fine-tuning the knee's head count first") for line in said)


def test_a_knee_that_misses_sends_the_search_above_it_with_the_runner_up_probed_when_close(knee_setup) -> None:
    steps, inputs, knee, total = knee_setup

    def score_of(_strategy: str, heads: int) -> float:
        return heads / total  # two strategies within the noise (here zero: every candidate predicts alike)

    # Nothing passes below knee + 1 even after fine-tuning, which adds little.
    threshold = score_of("cahp", steps[knee + 1].heads) - 1e-6
    case = SearchInputs(**{**_probing(inputs).__dict__, "threshold": threshold})
    winner, _, probes, said = _probed(steps, case, score_of, gain=1e-5)
    assert winner is not None and winner.step == knee + 1
    assert len(steps[knee].options) == 2
    at_knee = [probe for probe in probes if probe[1] == steps[knee].heads]
    assert [probe[0] for probe in at_knee] == ["cahp", "salience"]  # the close runner-up, after the miss
    # The knee's probe trains the protocol's epochs, every other probe (its runner-up too) the screen's.
    assert at_knee[0][2] == 3.0 and all(probe[2] == 0.5 for probe in probes[1:])
    assert any("the runner-up" in line for line in said)


def test_a_runner_up_is_not_probed_when_the_best_met_the_budget(knee_setup) -> None:
    steps, inputs, _, _ = knee_setup

    def score_of(_strategy: str, _heads: int) -> float:
        return 0.6  # the runner-up as close as can be

    case = SearchInputs(**{**_probing(inputs).__dict__, "threshold": 0.5})
    winner, _, probes, _ = _probed(steps, case, score_of, gain=0.0)
    assert winner is not None and winner.step == 0
    assert all(strategy == "cahp" for strategy, _, _ in probes)


# --------------------------------------------------------------------------- whole runs


@pytest.fixture(scope="module")
def run_inputs(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("bisection")
    make_classifier("bert", layers=3, heads=4, num_labels=3, seed=2).save_pretrained(root / "base")
    make_tokenizer().save_pretrained(root / "base")
    return root / "base", write_three_class_dataset(root / "data", {"train": (90, 0), "test": (45, 1)})


def _run(run_inputs, out: Path, store: Path | None = None, **changes):
    lines: list[str] = []
    config = PruningConfig(**{**FAST, "recovery_loss": "ce", "max_accuracy_drop": 3.0, "recovery": "reconstruct",
                              "budget_strategies": STRATEGIES, **changes})
    report = run_pruning(RunRequest(model_ref=str(run_inputs[0]), dataset_ref=str(run_inputs[1]), output_dir=out,
                                    config=config),
                         RunHooks(log=lines.append,
                                  resume_store=None if store is None else DirectoryResumeStore(store)))
    return report, lines


def _path(report) -> list[tuple[str, int, float]]:
    return [(c.strategy, c.k, c.reconstructed.score) for c in report.budget.candidates]


def test_a_run_records_its_path_and_what_it_skipped_and_is_deterministic(run_inputs, tmp_path: Path) -> None:
    report, lines = _run(run_inputs, tmp_path / "a")
    budget = report.budget
    assert budget is not None and budget.candidates
    ladder_size = len(budget.candidates) + len(budget.skipped)
    assert ladder_size >= len(budget.ladder) and budget.skipped
    assert [c.round for c in budget.candidates] == list(range(len(budget.candidates)))
    assert all(c.reason.startswith(f"#{c.round + 1} on the search's path") for c in budget.candidates)
    scored = {(c.strategy, c.k) for c in budget.candidates}
    assert not scored & {(s.strategy, s.k) for s in budget.skipped}
    assert any(line.startswith("scoring about ") for line in lines)
    written = json.loads((tmp_path / "a" / "report.json").read_text())
    assert written["budget"]["skipped"][0]["reason"] == budget.skipped[0].reason
    # Nothing fine-tuned: the search is priced in candidates, one candidate's reconstruction and scoring being what
    # one `reconstruct` run's recovery costs; the search scored every candidate, so it is at least half of them.
    single = statistics.median(c.seconds for c in budget.candidates)
    assert budget.epochs_trained == 0 and budget.final_recovery_seconds == 0
    assert budget.cost_vs_single_run == pytest.approx(budget.search_seconds / single)
    assert budget.cost_vs_single_run >= len(budget.candidates) / 2
    assert written["budget"]["cost_vs_single_run"] == pytest.approx(budget.cost_vs_single_run)
    from app.cli.prune import format_summary

    assert (f"    {len(budget.candidates)} candidates scored after reconstruction, none fine-tuned; search "
            f"{budget.search_seconds:.1f} s = x{budget.cost_vs_single_run:.2f} one candidate's reconstruction and "
            "scoring (a single run's recovery)") in format_summary(report, tmp_path / "a").splitlines()
    again, _ = _run(run_inputs, tmp_path / "b")
    assert _path(again) == _path(report) and again.budget.chosen == budget.chosen


def test_a_resumed_search_does_not_score_again_what_it_recorded(run_inputs, tmp_path: Path) -> None:
    store = tmp_path / "store"
    first, _ = _run(run_inputs, tmp_path / "a", store)
    scored = len(first.budget.candidates)
    assert scored >= 3
    # An attempt stopped after two candidates: the store keeps those two.
    stage = store / "budget_scores" / "stage.json"
    saved = json.loads(stage.read_text())
    assert len(saved["scores"]) == scored
    saved["scores"] = saved["scores"][:2]
    stage.write_text(json.dumps(saved))
    second, lines = _run(run_inputs, tmp_path / "b", store)
    assert "budget: 2 candidate(s) scored by an earlier attempt are not scored again" in lines
    rows = [line for line in lines if line.lstrip().startswith("[")]
    assert sum("(scored by an earlier attempt)" in line for line in rows) == 2
    assert len(rows) == scored  # the others scored once each, none twice
    assert _path(second) == _path(first) and second.budget.chosen == first.budget.chosen
    # The whole record kept: a third attempt scores nothing.
    third, lines = _run(run_inputs, tmp_path / "c", store)
    rows = [line for line in lines if line.lstrip().startswith("[")]
    assert rows and all("(scored by an earlier attempt)" in line for line in rows)
    assert _path(third) == _path(first)
