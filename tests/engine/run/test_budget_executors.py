"""Who runs an accuracy budget's candidates does not change the answer; a k-ary search tries several head
counts per round. Real runs of ``run_pruning`` on a tiny model: the default executor (in turn, in memory)
against one that runs each rung's pieces in reverse order and carries every candidate between two of its
pieces on disk, as the job service's worker pool does."""

from __future__ import annotations

import dataclasses
import math
import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from cahp_engine.config import PruningConfig
from cahp_engine.run import (
    CandidateResult,
    CandidateRun,
    CandidateSpec,
    RunHooks,
    RunRequest,
    SearchInputs,
    load_candidate,
    recover_candidate,
    run_pruning,
    save_candidate,
)
from cahp_engine.run._budget import probes
from tests.support.helpers import write_split
from tests.support.tiny_models import make_classifier, make_tokenizer

FAST = {"resolution": 6, "signature_samples": "all", "calibration_fraction": 1.0, "stability_shards": 0,
        "epochs": 2, "dense_finetune": "always", "dense_epochs": 4, "dense_lr": 2e-3, "lr": 5e-4, "batch_size": 16,
        "latency_warmup": 0, "latency_repeats": 1, "export": "none", "seed": 5}


class OnDisk:
    """Each rung's pieces in reverse order; a candidate saved after each piece and loaded for the next."""

    def __init__(self, root: Path) -> None:
        self.root, self.pieces, self.loaded = root, 0, 0

    def run(self, pieces: Sequence[CandidateSpec], inputs: SearchInputs) -> list[CandidateResult]:
        out: dict[str, CandidateResult] = {}
        for spec in reversed(pieces):
            directory = self.root / spec.key
            resume = None
            if directory.is_dir():
                resume, self.loaded = load_candidate(spec, inputs, directory), self.loaded + 1
            result = recover_candidate(spec, inputs, resume=resume)
            assert result.run is not None
            shutil.rmtree(directory, ignore_errors=True)
            save_candidate(result.run, directory)
            out[spec.key], self.pieces = dataclasses.replace(result, run=None), self.pieces + 1
        return [out[spec.key] for spec in pieces]

    def resume(self, spec: CandidateSpec, inputs: SearchInputs) -> CandidateRun:
        self.loaded += 1
        return load_candidate(spec, inputs, self.root / spec.key)

    def release(self, spec: CandidateSpec) -> None:
        shutil.rmtree(self.root / spec.key, ignore_errors=True)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("inputs")
    make_classifier("bert", layers=3, heads=4, num_labels=3, seed=2).save_pretrained(root / "model")
    make_tokenizer().save_pretrained(root / "model")
    for split, (n, seed) in {"train": (150, 0), "validation": (30, 2), "test": (45, 1)}.items():
        write_split(root / "data" / f"{split}.csv", n, seed=seed)
    return str(root / "model"), str(root / "data")


def _timeless(report) -> dict:
    budget = report.budget.to_dict()
    for key in ("search_seconds", "final_recovery_seconds", "cost_vs_single_run"):
        budget.pop(key)
    for candidate in budget["candidates"]:
        candidate.pop("seconds")
    return budget


def test_probes_split_the_interval_evenly_and_one_is_bisection() -> None:
    for lo, hi in [(-1, 7), (-1, 8), (2, 9), (-1, 2), (3, 5)]:
        assert probes(lo, hi, 1) == [(lo + hi) // 2]
        for width in (2, 3, 5, 20):
            picked = probes(lo, hi, width)
            assert picked == sorted(set(picked)) and all(lo < i < hi for i in picked)
            assert 1 <= len(picked) <= min(width, hi - lo - 1)
    assert probes(-1, 8, 2) == [2, 5] and probes(-1, 7, 3) == [1, 3, 5]


@pytest.mark.parametrize("parallel", [1, 2])
def test_the_answer_is_the_same_whoever_runs_the_candidates_and_in_whatever_order(inputs, tmp_path, parallel):
    config = PruningConfig(**{**FAST, "epochs": 3}, max_accuracy_drop=1.0, budget_parallel=parallel,
                           budget_screen_epochs=0.5, recovery="finetune")
    here = run_pruning(RunRequest(*inputs, output_dir=tmp_path / "here", config=config))
    pool = OnDisk(tmp_path / "pieces")
    there = run_pruning(RunRequest(*inputs, output_dir=tmp_path / "there", config=config),
                        RunHooks(candidates=pool))
    assert pool.pieces >= len(here.budget.candidates)  # every candidate tried is at least one piece
    assert pool.loaded >= 2  # candidates went on from pieces saved on disk (the chosen one at least)
    assert max(c.round for c in here.budget.candidates) >= 1 and any(
        c.epochs > 0.5 for c in here.budget.candidates if not c.chosen)  # several rounds, several rungs
    assert _timeless(here) == _timeless(there)
    assert here.selection.kept == there.selection.kept and here.metrics.pruned == there.metrics.pruned
    assert here.recovery.validation == there.recovery.validation
    assert not any((tmp_path / "pieces").iterdir())  # every candidate was let go


def test_a_k_ary_search_tries_several_head_counts_per_round(inputs, tmp_path):
    config = PruningConfig(**FAST, max_accuracy_drop=100.0, budget_parallel=3, budget_screen_epochs=0.5,
                           recovery="finetune")
    report = run_pruning(RunRequest(*inputs, output_dir=tmp_path / "out", config=config))
    b = report.budget
    rounds = sorted({c.round for c in b.candidates})
    first = sorted({c.heads_kept for c in b.candidates if c.round == 0})
    assert first == [b.ladder[i] for i in probes(-1, len(b.ladder), 3)] and len(first) == min(3, len(b.ladder))
    # P = 100: every head count meets it, so each round moves the upper end to its fewest heads.
    assert b.chosen == b.ladder[0] == report.summary.heads_kept
    assert len(rounds) <= math.ceil(math.log(len(b.ladder) + 1, 4)) + 1
    assert len(rounds) < len(b.ladder)


def test_a_budget_judged_after_reconstruction_gets_the_same_answer_through_the_pool(inputs, tmp_path):
    # The bisection scores in the run's own process; the fine-tunings go to the executor, here through disk.
    config = PruningConfig(**{**FAST, "epochs": 2}, max_accuracy_drop=3.0, recovery="reconstruct+finetune",
                           budget_parallel=2)
    here = run_pruning(RunRequest(*inputs, output_dir=tmp_path / "here", config=config))
    pool = OnDisk(tmp_path / "pieces")
    there = run_pruning(RunRequest(*inputs, output_dir=tmp_path / "there", config=config), RunHooks(candidates=pool))
    assert pool.pieces >= 1 and pool.loaded >= 1  # the chosen one went on from its piece saved on disk
    assert _timeless(here) == _timeless(there) and here.budget.skipped == there.budget.skipped
    assert [c.reconstructed for c in here.budget.candidates] == [c.reconstructed for c in there.budget.candidates]
    assert here.selection.kept == there.selection.kept and here.metrics.pruned == there.metrics.pruned
    assert not any((tmp_path / "pieces").iterdir())
