"""Recovery modes through a whole run: fine-tuning, layer-wise reconstruction alone, and both.

Real tiny models, real runs (``run_pruning``): the reconstruction is a stage with its timing, its log
lines, its record in report.json, and the checkpoint the run writes holds the reconstructed weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cahp_engine.config import PruningConfig
from cahp_engine.errors import ConfigError, InvalidInputError
from cahp_engine.models import load_pruned
from cahp_engine.progress import skipped_stages
from cahp_engine.recovery import Reconstruction, evaluate
from cahp_engine.run import RunHooks, RunRequest, run_pruning
from tests.support.recovery import FAST, encoded_texts, write_three_class_dataset
from tests.support.tiny_models import make_classifier, make_tokenizer


def _model_and_data(root: Path, heads: int) -> tuple[Path, Path]:
    """A tiny real BERT of 2 layers x ``heads`` heads of 8 dimensions, and a three-class dataset."""
    make_classifier("bert", layers=2, heads=heads, num_labels=3, seed=2).save_pretrained(root / "base")
    make_tokenizer().save_pretrained(root / "base")
    return root / "base", write_three_class_dataset(root / "data", {"train": (90, 0), "test": (45, 1)})


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> tuple[Path, Path]:
    return _model_and_data(tmp_path_factory.mktemp("modes"), heads=4)


def _run(inputs: tuple[Path, Path], out: Path, **changes):
    lines: list[str] = []
    stages: list[str] = []
    config = PruningConfig(**{**FAST, "heads_to_keep": 3, "recovery_loss": "distill", **changes})
    report = run_pruning(RunRequest(model_ref=str(inputs[0]), dataset_ref=str(inputs[1]), output_dir=out,
                                    config=config),
                         RunHooks(log=lines.append, progress=lambda stage, _fraction: stages.append(stage)))
    return report, lines, stages


def test_reconstruct_alone_trains_nothing_and_reports_the_stage(inputs, tmp_path: Path) -> None:
    report, lines, stages = _run(inputs, tmp_path / "out", recovery="reconstruct")

    assert isinstance(report.reconstruction, Reconstruction)
    assert report.reconstruction.fits and all(f.error_after < f.error_before for f in report.reconstruction.fits)
    assert report.recovery.steps == 0
    assert "reconstruction" in report.timings_s and "teacher" not in report.timings_s
    assert "reconstruction" in stages
    assert any(line.startswith("layer-wise reconstruction (ridge, residual target, feed-forward residual)")
               for line in lines)
    assert any("recovery fine-tuning: none" in line for line in lines)
    written = json.loads((tmp_path / "out" / "report.json").read_text())
    assert written["reconstruction"]["fits"][0]["sublayer"] == "attention"
    assert written["config"]["recovery"] == "reconstruct"
    card = (tmp_path / "out" / report.checkpoint.path / "README.md").read_text()
    assert ("layer-wise reconstruction: the attention and feed-forward output projections of each layer refit "
            "by ridge least squares (residual targets)") in card
    assert "recovery fine-tuning: none (the reconstructed weights are the model)" in card
    # What the run saved is the reconstructed model: it scores what the report says.
    saved = load_pruned(tmp_path / "out" / report.checkpoint.path)
    assert evaluate(saved, encoded_texts(45, seed=1)).accuracy == pytest.approx(report.metrics.pruned.accuracy)


def test_reconstruct_then_finetune_trains_from_the_reconstructed_weights(inputs, tmp_path: Path) -> None:
    report, _, _ = _run(inputs, tmp_path / "out", recovery="reconstruct+finetune")
    assert report.reconstruction is not None and report.recovery.steps > 0
    assert "teacher" in report.timings_s and "reconstruction" in report.timings_s


def test_finetune_alone_has_no_reconstruction(inputs, tmp_path: Path) -> None:
    report, _, _ = _run(inputs, tmp_path / "out", recovery="finetune")
    assert report.config.recovery == "finetune" and report.reconstruction is None
    assert "reconstruction" not in report.timings_s
    assert json.loads((tmp_path / "out" / "report.json").read_text())["reconstruction"] is None


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> tuple[Path, Path]:
    # A layer of 8 heads x 8 dimensions has up to 65 unknowns per output; one row per class of at most 16
    # tokens each (`reconstruction_rows` 1) cannot pin them down.
    return _model_and_data(tmp_path_factory.mktemp("wide"), heads=8)


def test_too_few_calibration_tokens_for_reconstruction_alone_are_refused_before_any_work(wide, tmp_path: Path) -> None:
    stages: list[str] = []
    config = PruningConfig(**{**FAST, "heads_to_keep": 3, "reconstruction_rows": 1, "recovery": "reconstruct"})
    with pytest.raises(InvalidInputError, match=r"`recovery` 'reconstruct' needs at least 65 calibration "
                                                r"tokens .*the 3 training rows it draws \(`reconstruction_rows` 1, "
                                                r"at least one per class\) hold \d+; give more or longer training "
                                                r"rows, or use `recovery` 'finetune'"):
        run_pruning(RunRequest(model_ref=str(wide[0]), dataset_ref=str(wide[1]), output_dir=tmp_path / "out",
                               config=config), RunHooks(progress=lambda stage, _fraction: stages.append(stage)))
    assert not {"dense_finetune", "signatures"} & set(stages)  # refused before any work


def test_a_run_that_fine_tunes_leaves_the_layers_short_of_tokens_as_pruned_and_says_so(wide, tmp_path: Path) -> None:
    # With too few calibration tokens for the layers it cut, a run that reconstructs and then fine-tunes
    # refits none of them, says which and why, and the fine-tuning recovers the model.
    report, lines, _ = _run(wide, tmp_path / "out", heads_to_keep=12, reconstruction_rows=1, recovery_loss="ce",
                            recovery="reconstruct+finetune")
    assert report.config.recovery == "reconstruct+finetune"
    rebuilt = report.reconstruction
    assert rebuilt is not None and rebuilt.fits == () and report.recovery.steps > 0
    short = [note for note in rebuilt.notes if "left as pruned" in note]
    assert len(short) == 1 and short[0].startswith("the attention refit of layer(s) 0, 1 need up to ")
    assert f"calibration tokens, got {rebuilt.rows}: left as pruned for fine-tuning to recover" in short[0]
    assert short[0] in lines and "reconstruction" in report.timings_s
    written = json.loads((tmp_path / "out" / "report.json").read_text())
    assert short[0] in written["reconstruction"]["notes"]


def test_the_modes_skip_the_stages_they_do_not_run() -> None:
    assert PruningConfig().recovery == "finetune"  # the default, by measurement (docs/performance.md)
    assert "reconstruction" in skipped_stages(PruningConfig(recovery="finetune"))
    only = skipped_stages(PruningConfig(recovery="reconstruct"))
    assert "recovery" in only and "teacher" in only and "reconstruction" not in only
    both = skipped_stages(PruningConfig(recovery="reconstruct+finetune"))
    assert "recovery" not in both and "reconstruction" not in both


def test_a_bad_mode_or_row_count_says_what_to_change() -> None:
    with pytest.raises(ConfigError, match="`recovery` must be one of finetune, reconstruct, reconstruct\\+finetune"):
        PruningConfig(recovery="retrain")
    with pytest.raises(ConfigError, match="`reconstruction_rows` must be an integer"):
        PruningConfig(reconstruction_rows=0)
    with pytest.raises(ConfigError, match="`budget_search` 'halving' fine-tunes every candidate and `recovery` "
                                          "'reconstruct' fine-tunes none; set `budget_search` to 'judged'"):
        PruningConfig(recovery="reconstruct", budget_search="halving")
    with pytest.raises(ConfigError, match="`budget_search` must be one of auto, judged, halving"):
        PruningConfig(budget_search="bisect")


# --------------------------------------------------------------------------- the budget judged after reconstruction


def _budget_run(inputs, out: Path, progress: list[tuple[str, float]] | None = None, **changes):
    lines: list[str] = []
    config = PruningConfig(**{**FAST, "recovery_loss": "ce", "max_accuracy_drop": 100.0,
                              "budget_strategies": ("cahp", "salience", "cahp-layer-salience"), **changes})
    heard = progress if progress is not None else []
    report = run_pruning(RunRequest(model_ref=str(inputs[0]), dataset_ref=str(inputs[1]), output_dir=out,
                                    config=config),
                         RunHooks(log=lines.append, progress=lambda stage, overall: heard.append((stage, overall))))
    return report, lines


def test_a_budget_judged_after_reconstruction_scores_a_bisection_and_trains_none(inputs, tmp_path: Path) -> None:
    progress: list[tuple[str, float]] = []
    report, lines = _budget_run(inputs, tmp_path / "out", progress, recovery="reconstruct")
    budget = report.budget
    assert budget is not None and budget.candidates
    assert all(c.reconstructed is not None and c.stopped == "judged" and c.epochs == 0 for c in budget.candidates)
    # Every candidate of the ladder is either scored or skipped with a reason; none trained. Within a budget
    # of 100 points every count passes: the bisection goes down to the fewest heads and skips the rest.
    heads = {c.heads_kept for c in budget.candidates} | {s.heads_kept for s in budget.skipped}
    assert heads == set(budget.ladder) and budget.skipped
    assert budget.chosen == min(budget.ladder) and report.recovery.steps == 0 and budget.epochs_trained == 0
    assert any("after reconstruction" in line for line in lines)
    written = json.loads((tmp_path / "out" / "report.json").read_text())
    assert written["budget"]["candidates"][0]["reconstructed"]["score"] == budget.candidates[0].reconstructed.score


def test_reconstruct_then_finetune_trains_only_the_chosen_candidate_and_records_both_scores(
    inputs, tmp_path: Path,
) -> None:
    report, lines = _budget_run(inputs, tmp_path / "out", recovery="reconstruct+finetune")
    budget = report.budget
    assert budget is not None
    trained = [c for c in budget.candidates if c.stopped != "judged"]
    chosen = [c for c in budget.candidates if c.chosen]
    assert len(chosen) == 1 and chosen[0] in trained and len(trained) <= 2  # the chosen one, a runner-up at most
    assert chosen[0].reconstructed is not None and chosen[0].curve[0].score == chosen[0].reconstructed.score
    assert report.recovery.steps > 0 and any(line.startswith("fine-tuning ") for line in lines)
    assert all(c.reconstructed is not None for c in budget.candidates)



def test_a_budget_judged_after_reconstruction_reports_its_scoring_and_the_chosen_reconstruction(
    inputs, tmp_path: Path,
) -> None:
    progress: list[tuple[str, float]] = []
    report, lines = _budget_run(inputs, tmp_path / "out", progress, recovery="reconstruct")
    budget = report.budget
    assert budget is not None
    total = len(budget.candidates)
    # The scoring moves the job: a log line and a step of the overall progress per candidate.
    rows = budget.validation_rows
    assert any(line.startswith("scoring about ") and f"candidates after reconstruction on {rows} validation rows"
               in line for line in lines)
    assert [line.split("]")[0].strip() for line in lines if line.lstrip().startswith("[")] == \
        [f"[{i}" for i in range(1, total + 1)]
    during = [overall for stage, overall in progress if stage == "budget"]
    assert len(set(during)) >= total and during == sorted(during)
    # The chosen candidate's reconstruction is the run's: report.json and the model card say so.
    rebuilt = report.reconstruction
    assert isinstance(rebuilt, Reconstruction) and rebuilt.fits
    assert all(f.error_after < f.error_before for f in rebuilt.fits)
    written = json.loads((tmp_path / "out" / "report.json").read_text())
    assert written["reconstruction"]["fits"] == [f.to_dict() for f in rebuilt.fits]
    card = (tmp_path / "out" / report.checkpoint.path / "README.md").read_text()
    assert ("layer-wise reconstruction: the attention and feed-forward output projections of each layer refit "
            "by ridge least squares (residual targets)") in card


def test_a_budget_fine_tuned_after_reconstruction_reports_the_chosen_reconstruction(inputs, tmp_path: Path) -> None:
    report, _ = _budget_run(inputs, tmp_path / "out", recovery="reconstruct+finetune")
    assert report.budget is not None and report.reconstruction is not None and report.reconstruction.fits
    assert report.recovery.steps > 0


def test_a_budget_with_fine_tuning_alone_has_no_reconstruction(inputs, tmp_path: Path) -> None:
    report, _ = _budget_run(inputs, tmp_path / "out", recovery="finetune", budget_strategies=("cahp",))
    assert report.budget is not None and report.reconstruction is None


def test_a_budget_judged_with_fine_tuning_alone_scores_after_reconstruction_and_trains_the_knee_first(
        inputs, tmp_path: Path) -> None:
    report, lines = _budget_run(inputs, tmp_path / "out", recovery="finetune", budget_search="judged",
                                budget_strategies=("cahp", "salience"))
    budget = report.budget
    assert budget is not None and report.reconstruction is None  # the reconstruction judged, it did not recover
    assert all(c.reconstructed is not None for c in budget.candidates)
    assert any(line.startswith("fine-tuning the knee's head count first") for line in lines)
    first_trained = next(c for c in budget.candidates if c.stopped != "judged")
    knee_line = next(line for line in lines if line.startswith("fine-tuning the knee's head count first"))
    assert f"({first_trained.heads_kept} heads)" in knee_line  # the first probe is the knee's head count
    assert report.recovery.steps > 0 and any(c.chosen for c in budget.candidates)
