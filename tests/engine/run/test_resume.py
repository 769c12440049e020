"""A run stopped in recovery goes on from its last saved state and ends as the run that was never stopped.

Real runs of ``run_pruning`` on a tiny model: one uninterrupted, one stopped (cancelled) once recovery
has saved its first epoch, then resumed from the same resume store in a fresh call. Also: a run's
overall progress never goes back, and a long stage logs its pace.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from cahp_engine.config import PruningConfig
from cahp_engine.errors import JobCancelledError
from cahp_engine.progress import RowCounts, StagePlan, stage_plan
from cahp_engine.run import DirectoryResumeStore, RunHooks, RunRequest, run_pruning
from tests.support.helpers import write_tiny_dataset, write_tiny_model

#: Dense fine-tuning and distillation on, so every stage that can be saved for a resume is.
CONFIG = PruningConfig(epochs=3, dense_finetune="always", dense_epochs=2, batch_size=16, max_length=32, seed=0,
                       export="none", recovery_loss="distill", latency_repeats=1, latency_warmup=0)

TRAIN_ROWS, TEST_ROWS = 60, 30


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("inputs")
    data = write_tiny_dataset(root / "data", train=TRAIN_ROWS, test=TEST_ROWS)
    return str(write_tiny_model(root / "model")), str(data)


@pytest.fixture(scope="module")
def uninterrupted(inputs: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("whole") / "out"
    progress: list[tuple[str, float]] = []
    lines: list[str] = []
    plans: list[tuple[int, StagePlan]] = []  # each plan heard, with the number of reports heard before it
    report = run_pruning(RunRequest(*inputs, output_dir=out, config=CONFIG),
                         RunHooks(progress=lambda s, f: progress.append((s, f)), log=lines.append, log_interval_s=0.0,
                                  plan=lambda plan: plans.append((len(progress), plan))))
    return {"report": report, "out": out, "progress": progress, "lines": lines, "plans": plans}


def test_a_run_stopped_in_recovery_resumes_from_its_last_epoch_and_ends_as_the_uninterrupted_one(
    inputs: tuple[str, str], uninterrupted: dict, tmp_path: Path,
) -> None:
    store = DirectoryResumeStore(tmp_path / "checkpoints")

    def stop_after_first_epoch() -> bool:
        saved = store.restore().get("recovery_training")
        return saved is not None and json.loads((saved / "stage.json").read_text())["step"] >= 1

    first: list[str] = []
    with pytest.raises(JobCancelledError):
        run_pruning(RunRequest(*inputs, output_dir=tmp_path / "a", config=CONFIG),
                    RunHooks(resume_store=store, should_cancel=stop_after_first_epoch, log=first.append))
    # The dense fine-tuning's own state went once its result was saved.
    assert set(store.restore()) == {"dense", "selection", "pruned", "recovery_training"}
    saved_step = json.loads((store.restore()["recovery_training"] / "stage.json").read_text())["step"]

    lines: list[str] = []
    report = run_pruning(RunRequest(*inputs, output_dir=tmp_path / "b", config=CONFIG),
                         RunHooks(resume_store=store, log=lines.append))
    text = "\n".join(lines)
    assert "resuming from the checkpoints of an earlier attempt" in text
    assert "the fine-tuned dense model saved by an earlier attempt" in text
    assert "selection: saved by an earlier attempt" in text
    assert f"recovery: going on from step {saved_step} (saved by an earlier attempt)" in text
    assert "dense fine-tuning (" not in text and "selecting heads" not in text  # neither ran again

    whole = uninterrupted["report"]
    assert report.recovery.steps == whole.recovery.steps and saved_step < whole.recovery.steps
    assert report.recovery.loss_per_epoch == pytest.approx(whole.recovery.loss_per_epoch, rel=1e-6)
    assert report.summary.pruned_accuracy == whole.summary.pruned_accuracy
    assert report.selection.kept == whole.selection.kept and report.metrics.pruned == whole.metrics.pruned
    ours = load_file(str(tmp_path / "b" / "model" / "model.safetensors"))
    theirs = load_file(str(uninterrupted["out"] / "model" / "model.safetensors"))
    assert ours.keys() == theirs.keys()
    for name, tensor in ours.items():
        torch.testing.assert_close(tensor, theirs[name], rtol=1e-5, atol=1e-6, msg=name)


def test_resume_state_of_a_run_with_other_settings_is_not_used(inputs: tuple[str, str], tmp_path: Path) -> None:
    store = DirectoryResumeStore(tmp_path / "checkpoints")
    quick = PruningConfig(epochs=1, dense_finetune="never", untrained_dense="warn", batch_size=16, max_length=32,
                          seed=0, export="none",
                          latency_repeats=1, latency_warmup=0)
    run_pruning(RunRequest(*inputs, output_dir=tmp_path / "a", config=quick),
                RunHooks(resume_store=store))
    lines: list[str] = []
    run_pruning(RunRequest(*inputs, output_dir=tmp_path / "b", config=PruningConfig(**{**quick.to_dict(), "seed": 1})),
                RunHooks(resume_store=store, log=lines.append))
    assert any(line.startswith("ignoring the checkpoints ") for line in lines)
    assert "selecting heads" in lines


def test_a_runs_progress_never_goes_back_and_reaches_the_end(uninterrupted: dict) -> None:
    values = [fraction for _, fraction in uninterrupted["progress"]]
    assert values == sorted(values) and values[-1] == 1.0
    stages = [stage for stage, _ in uninterrupted["progress"]]
    # Every stage of the run was heard, the evaluation before recovery under its own name.
    assert {"dense_finetune", "signatures", "teacher", "pruned_evaluation", "recovery", "evaluation"} <= set(stages)
    assert stages.index("pruned_evaluation") < stages.index("recovery")


def test_once_loaded_a_run_places_its_stages_by_its_own_rows(uninterrupted: dict) -> None:
    [(heard, plan)] = uninterrupted["plans"]
    progress = uninterrupted["progress"]
    # Heard as loading ends, before any other stage reports.
    assert {stage for stage, _ in progress[:heard]} == {"load"} and progress[heard][0] != "load"
    assert plan == stage_plan(CONFIG, RowCounts(train=TRAIN_ROWS, evaluation=TEST_ROWS))
    # From then on each stage's reports lie in the span the plan gives it.
    for (_, before), (stage, overall) in zip(progress[heard - 1:], progress[heard:], strict=False):
        lo, hi = plan.spans.get(stage, (0.0, 0.0))
        if hi > lo:
            assert lo - 1e-9 <= overall <= hi + 1e-9, (stage, overall, plan.spans[stage])
        else:  # a stage the plan does not place holds the progress where it is
            assert overall == before, stage


def test_a_fine_tuning_logs_its_epoch_loss_and_pace(uninterrupted: dict) -> None:
    training = [line for line in uninterrupted["lines"] if line.startswith("recovery: epoch ")]
    assert training, uninterrupted["lines"]
    assert all(" of 3, step " in line and ", loss " in line and " rows/s" in line for line in training)


def test_a_damaged_saved_stage_is_said_and_runs_again(inputs: tuple[str, str], tmp_path: Path) -> None:
    store = DirectoryResumeStore(tmp_path / "checkpoints")
    quick = PruningConfig(epochs=1, dense_finetune="never", untrained_dense="warn", batch_size=16,
                          max_length=32, seed=0, export="none", latency_repeats=1, latency_warmup=0)
    first = run_pruning(RunRequest(*inputs, output_dir=tmp_path / "a", config=quick),
                        RunHooks(resume_store=store))
    (store.restore()["selection"] / "selection.json").write_text('{"selection": "not one"}')
    lines: list[str] = []
    again = run_pruning(RunRequest(*inputs, output_dir=tmp_path / "b", config=quick),
                        RunHooks(resume_store=store, log=lines.append))
    assert any(line.startswith("the checkpoint selection cannot be used (") for line in lines)
    assert "selecting heads" in lines and again.selection.kept == first.selection.kept


@pytest.mark.parametrize("save_when_stopped", [True, False], ids=["handed-back", "cancelled"])
def test_a_run_stopped_mid_epoch_saves_its_last_step_only_when_asked_and_resumes_from_it(
    inputs: tuple[str, str], uninterrupted: dict, tmp_path: Path, save_when_stopped: bool,
) -> None:
    whole = uninterrupted["report"]
    per_epoch = round(whole.recovery.steps / whole.recovery.epochs)
    stop_at = per_epoch + per_epoch // 2 + 1  # in the middle of recovery's second epoch
    assert stop_at % per_epoch and stop_at < whole.recovery.steps
    store = DirectoryResumeStore(tmp_path / "checkpoints")
    steps_taken: list[float] = []

    def progress(stage: str, _fraction: float) -> None:
        if stage == "recovery":
            steps_taken.append(_fraction)

    first: list[str] = []
    with pytest.raises(JobCancelledError):
        # Recovery reports once before training and once per step: stop once stop_at steps are taken.
        run_pruning(RunRequest(*inputs, output_dir=tmp_path / "a", config=CONFIG),
                    RunHooks(resume_store=store, progress=progress, log=first.append,
                             should_cancel=lambda: len(steps_taken) > stop_at,
                             save_when_stopped=lambda: save_when_stopped))
    saved = json.loads((store.restore()["recovery_training"] / "stage.json").read_text())["step"]
    if save_when_stopped:
        assert saved % per_epoch and saved > per_epoch, saved  # the last step taken, not an epoch's end
        assert f"recovery: stopped at step {saved}; its state is saved for the next attempt" in first
    else:
        assert saved == per_epoch  # only the stops (epoch ends) were saved
        assert not any("its state is saved for the next attempt" in line for line in first)

    lines: list[str] = []
    report = run_pruning(RunRequest(*inputs, output_dir=tmp_path / "b", config=CONFIG),
                         RunHooks(resume_store=store, log=lines.append))
    assert f"recovery: going on from step {saved} (saved by an earlier attempt)" in lines
    assert report.recovery.steps == whole.recovery.steps
    assert report.recovery.loss_per_epoch == pytest.approx(whole.recovery.loss_per_epoch, rel=1e-5)
    ours = load_file(str(tmp_path / "b" / "model" / "model.safetensors"))
    theirs = load_file(str(uninterrupted["out"] / "model" / "model.safetensors"))
    for name, tensor in ours.items():
        torch.testing.assert_close(tensor, theirs[name], rtol=1e-5, atol=1e-6, msg=name)
