"""``python -m studies benchmarks``'s code paths on a tiny random model and tiny SST-5- and MNLI-shaped
datasets (the study itself never runs in tests): every cell, the report and figure from the record alone,
a rerun that computes nothing, the reuse of a quality-study cell, and the decision rule on set figures."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cahp_engine.config import PruningConfig
from cahp_engine.models import save_pruned
from cahp_engine.run._reconstruct import calibration_batches, reconstruct_pruned
from studies import benchmarks, benchmarks_report, common, quality
from tests.support.tiny_models import WORDS, make_classifier, make_tokenizer


def _write(path: Path, n: int, *, classes: int, columns: list[str], seed: int) -> None:
    """Rows whose first word depends on the class, so the tiny model learns something."""
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow([*columns, "label"])
        for i in range(n):
            label = i % classes
            texts = [" ".join([WORDS[label], *(WORDS[int(j)] for j in rng.integers(0, len(WORDS), size=5))])
                     for _ in columns]
            writer.writerow([*texts, label])


@pytest.fixture()
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> benchmarks.Setup:
    sst, nli = tmp_path / "sst5", tmp_path / "mnli"
    _write(sst / "train.csv", 120, classes=5, columns=["text"], seed=1)
    _write(sst / "test.csv", 40, classes=5, columns=["text"], seed=2)
    _write(nli / "train.csv", 120, classes=3, columns=["premise", "hypothesis"], seed=3)
    _write(nli / "validation_matched.csv", 30, classes=3, columns=["premise", "hypothesis"], seed=4)
    base = tmp_path / "base"
    save_pruned(make_classifier("bert", num_labels=5, layers=3, heads=4), make_tokenizer(), base)
    monkeypatch.setattr(common, "RESULTS", tmp_path / "results")
    # The agreement step names a base encoder even when it is given the dense model: the tiny one here,
    # so the test needs no real encoder installed.
    monkeypatch.setattr(common, "minilm_path", lambda: str(base))
    dense = quality.Protocol(name="tiny", model="tiny", dense_epochs=2, dense_lr=2e-3, dense_cpu_path="native",
                             resolution=6, batch_size=16)
    return benchmarks.Setup(
        tasks=(benchmarks.Task("sst5", sst, "test"),
               benchmarks.Task("mnli", nli, "validation_matched", "premise", "hypothesis")),
        base=str(base), cache=tmp_path / "cache", record=tmp_path / "record", seeds=(1, 2), degrees=(6, 2),
        dense=dense, recovery_epochs=1.0, recovery_lr=1e-3, quality_record=None, shared_caches={},
        selection_overrides={"signature_samples": "all", "calibration_fraction": 1.0, "max_length": 32},
        agreement_pairs=1, announce=tmp_path / "DENSE_MODELS.md")


def test_the_plan_puts_the_most_decisive_cells_first(setup):
    steps = benchmarks.plan(setup)
    cells = [s for s in steps if s[0] == "cell"]
    assert len(cells) == 2 * 2 * 2 * len(benchmarks.STRATEGIES)
    assert cells[0] == ("cell", "sst5", "1", "6", "cahp")
    assert [s[2:4] for s in cells[:20]] == [("1", "6")] * 10 + [("1", "2")] * 10  # seed 1 first, degree 6 first
    assert steps.index(("agreement", "mnli")) == 20  # after the first seed, before the second
    # With the quality study's record, SST-5's cells it holds come first (only their scores before recovery to do).
    reusing = benchmarks.plan(benchmarks.Setup(**{**setup.__dict__, "quality_record": Path("quality.json")}))
    first = [s for s in reusing if s[0] == "cell"][:12]
    assert {s[1] for s in first} == {"sst5"} and {s[4] for s in first} == set(benchmarks.QUALITY_STRATEGIES)
    assert sorted(reusing) == sorted(steps)


def test_every_cell_is_recorded_the_report_comes_from_the_record_and_a_rerun_computes_nothing(setup, monkeypatch):
    said: list[str] = []
    payload = benchmarks.run(setup, compute=True, say=said.append)
    assert payload["complete"] and payload["cells_done"] == 40
    for task in ("sst5", "mnli"):
        assert (setup.record / task / "dense.json").is_file()
        cost = payload["selection_cost"][task]
        assert cost["seeds"] == [1, 2] and cost["analysis_s"]["mean"] > 0
        for degree in ("6", "2"):
            rows = payload["summary"][task][degree]
            assert set(rows) == set(benchmarks.STRATEGIES)
            assert all(r["accuracy"]["n"] == 2 and r["before_macro_f1"]["n"] == 2 for r in rows.values())
            shares = payload["retention"][task][degree]["cahp"]["share"]
            assert len(shares) == 3 and all(0.0 <= s <= 1.0 for s in shares)
    told = setup.announce.read_text().splitlines()
    assert [line.split(":")[0] for line in told] == ["- sst5", "- mnli"] and str(setup.cache / "mnli") in told[1]
    cahp = json.loads(benchmarks.cell_path(setup, "mnli", 1, 6, "cahp").read_text())
    assert sum(cahp["kept_per_layer"]) == cahp["heads_kept"] and cahp["recovery"]["steps"] > 0
    assert cahp["cpu_s"] > 0 and payload["progress"]["mnli"]["left"] == 0
    # MNLI's agreement table is made (one pair here) and read back into the record's report.
    assert payload["agreement"]["mnli"]["6"]["cahp"] is not None
    assert payload["verdict"]["scores"] and "said" in payload["verdict"]
    doc = {**payload, "date": "today", "command": "python -m studies benchmarks"}
    text = benchmarks_report.markdown(doc)
    assert "| 6 | stability-selection |" in text and "## mnli" in text and "partial" not in text.split("\n")[0]
    benchmarks_report.plot_retention(doc, setup.record / "retention.png")
    assert (setup.record / "retention.png").stat().st_size > 0

    def refuse(*_args, **_kwargs):
        raise AssertionError("a finished selection or cell was computed again")

    monkeypatch.setattr(benchmarks, "finetune", refuse)
    monkeypatch.setattr(benchmarks, "analyze_heads", refuse)
    shutil.rmtree(setup.cache)  # another session: the models are gone, the record is all there is
    again = benchmarks.run(setup, compute=True, say=said.append)
    assert again["cells"] == payload["cells"] and again["summary"] == payload["summary"]
    assert not (setup.cache / "sst5" / "dense").exists()  # nothing to compute: no model trained


def test_a_quality_study_cell_of_the_same_heads_is_reused_and_another_dense_model_refused(setup, monkeypatch, tmp_path):
    one = benchmarks.Setup(**{**setup.__dict__, "tasks": setup.tasks[:1], "seeds": (1,), "degrees": (2,),
                              "strategies": ("cahp",)})
    partial = benchmarks.run(one, compute=True, say=lambda _line: None)
    # One task computed is half the rule's cells: the report says partial and gives no verdict.
    assert not partial["complete"] and partial["verdict"]["partial"] and partial["verdict"]["winner"] is None
    path = benchmarks.cell_path(one, "sst5", 1, 2, "cahp")
    cell = json.loads(path.read_text())
    heads = json.loads((one.record / "sst5" / "selection-seed1.json").read_text())["degrees"]["2"]["kept"]["cahp"]
    recorded: dict[str, Any] = {"settings": {"recovery_epochs": 1.0, "recovery_lr": 1e-3},
                "selections": {"1": {"degrees": {"2": {"kept": {"cahp": heads}}}}},
                "cells": [{"seed": 1, "degree": 2, "strategy": "cahp", "loss": "ce", "accuracy": 0.123,
                           "macro_f1": 0.1, "recall": [0.0] * 5, "recovery": {"wall_s": 9.0},
                           "accuracy_before_recovery": cell["before"]["accuracy"]}]}
    (tmp_path / "quality.json").write_text(json.dumps(recorded))
    path.unlink()

    def refuse(*_args, **_kwargs):
        raise AssertionError("a recorded recovery was computed again")

    monkeypatch.setattr(benchmarks, "finetune", refuse)
    reusing = benchmarks.Setup(**{**one.__dict__, "quality_record": tmp_path / "quality.json"})
    benchmarks.run(reusing, compute=True, say=lambda _line: None)
    reused = json.loads(path.read_text())
    assert reused["after"]["accuracy"] == 0.123 and reused["before"] == cell["before"]
    assert reused["recovery"]["reused_from"] == "quality.json"

    recorded["cells"][0]["accuracy_before_recovery"] = cell["before"]["accuracy"] + 0.5
    (tmp_path / "quality.json").write_text(json.dumps(recorded))
    path.unlink()
    with pytest.raises(SystemExit, match="not the same dense model"):
        benchmarks.run(reusing, compute=True, say=lambda _line: None)
    assert not path.exists()


def _cells(accuracies: dict[str, list[float]]) -> list[dict]:
    """Cells of two tasks x two degrees x three seeds: strategy -> 12 accuracies in that order."""
    keys = [(t, d, s) for t in ("sst5", "mnli") for d in (6, 2) for s in (42, 43, 44)]
    return [{"task": t, "degree": d, "seed": s, "strategy": name, "after": {"accuracy": acc}}
            for name, values in accuracies.items() for (t, d, s), acc in zip(keys, values, strict=True)]


def _verdict(accuracies: dict[str, list[float]], agreement: dict[str, float]) -> dict:
    payload = {"cells": _cells(accuracies),
               "agreement": {t: {str(d): dict(agreement) for d in (6, 2)} for t in ("sst5", "mnli")}}
    return benchmarks_report.verdict(payload, ["sst5", "mnli"], tuple(accuracies), (42, 43, 44), (6, 2))


def test_the_rule_takes_the_leader_unless_one_within_noise_agrees_clearly_better():
    noisy = [0.50, 0.52, 0.48] * 4
    # salience leads by a point in every cell: outside the noise, it wins whatever the agreement.
    v = _verdict({"cahp": noisy, "salience": [a + 0.01 for a in noisy], "random": [0.1] * 12},
                 {"cahp": 0.9, "salience": 0.5, "random": 0.1})
    assert v["winner"] == "salience" and v["leader"] == "salience" and not v["partial"] and v["change_default"]
    assert not v["noise"]["cahp"]["within_noise"] and "random" not in v["scores"]  # the floor is no candidate
    # stability selection trails by a noisy 0.1 point on the mean and agrees 0.1 better: it wins.
    trailing = [a + d for a, d in zip(noisy, [0.01, -0.01, 0.005, -0.008] * 3, strict=True)]
    v = _verdict({"cahp": noisy, "stability-selection": trailing}, {"cahp": 0.5, "stability-selection": 0.6})
    assert v["leader"] == "cahp" and v["noise"]["stability-selection"]["within_noise"]
    assert v["winner"] == "stability-selection"
    # ... but not by 0.04: cahp stays.
    v = _verdict({"cahp": noisy, "stability-selection": trailing}, {"cahp": 0.5, "stability-selection": 0.54})
    assert v["winner"] == "cahp" and not v["change_default"]
    # A missing cell or agreement figure leaves the verdict partial: it changes nothing.
    payload = {"cells": _cells({"cahp": noisy, "salience": [a + 0.01 for a in noisy]})[:-1],
               "agreement": {t: {str(d): {"cahp": 0.5, "salience": 0.5} for d in (6, 2)} for t in ("sst5", "mnli")}}
    v = benchmarks_report.verdict(payload, ["sst5", "mnli"], ("cahp", "salience"), (42, 43, 44), (6, 2))
    assert v["partial"] and not v["change_default"]


def test_a_reconstructed_start_is_kept_apart_scored_every_epoch_and_read_beside_the_pruned_start(setup, monkeypatch):
    one = benchmarks.Setup(**{**setup.__dict__, "tasks": setup.tasks[1:], "seeds": (1,), "degrees": (6,),
                              "strategies": ("cahp",), "recovery_epochs": 2.0})
    pruned_start = benchmarks.run(one, compute=True, say=lambda _line: None)
    theirs = json.loads(benchmarks.cell_path(one, "mnli", 1, 6, "cahp").read_text())
    assert pruned_start["reconstructed_start"] == []

    other = benchmarks.Setup(**{**one.__dict__, "start": "reconstructed"})
    assert ("agreement", "mnli") not in benchmarks.plan(other)  # the agreement is the pruned start's business

    def refuse(*_args, **_kwargs):
        raise AssertionError("the selection was made again")

    monkeypatch.setattr(benchmarks, "analyze_heads", refuse)
    said: list[str] = []
    payload = benchmarks.run(other, compute=True, say=said.append)
    path = benchmarks.cell_path(other, "mnli", 1, 6, "cahp")
    assert path.name == "seed1-degree6-cahp-reconstructed.json"
    mine = json.loads(path.read_text())
    # The pruned start's cell is untouched and the rule's cells are only the pruned start's.
    assert json.loads(benchmarks.cell_path(one, "mnli", 1, 6, "cahp").read_text()) == theirs
    assert payload["cells"] == pruned_start["cells"]
    assert mine["start"] == "reconstructed" and mine["before"] == theirs["before"]  # the same heads cut
    assert [e["epoch"] for e in mine["by_epoch"]] == [0.0, 1.0, 2.0] and mine["after"] == mine["by_epoch"][-1]["test"]
    assert mine["reconstruction"]["seconds"] > 0 and mine["reconstruction"]["tokens"] > 0
    assert mine["recovery"]["steps"] == theirs["recovery"]["steps"]

    # Epoch 0 is the model a `reconstruct+finetune` run would start from: the engine's refit with the seed.
    dense, train, test, _ = benchmarks.Loaded(other, other.tasks[0], lambda _line: None).get()
    again = benchmarks._pruned(dense, json.loads((one.record / "mnli" / "selection-seed1.json").read_text())
                               ["degrees"]["6"]["kept"]["cahp"])
    config = PruningConfig(seed=1)
    reconstruct_pruned(dense, again, calibration_batches(train, config), config)
    assert benchmarks._scores(again, test, other.device) == mine["by_epoch"][0]["test"] == mine["reconstructed"]

    row, = payload["reconstructed_start"]
    assert row["from_pruned"] == theirs["after"]["accuracy"] and row["by_epoch"][-1][1] == mine["after"]["accuracy"]
    assert any("reconstructed" in line for line in said)
    text = benchmarks_report.markdown({**payload, "date": "today", "command": "python -m studies benchmarks"})
    assert "## Recovery from the reconstructed model" in text and "| mnli | 1 | 6 | cahp |" in text
    # A rerun computes nothing more.
    monkeypatch.setattr(benchmarks, "FineTuning", refuse)
    assert benchmarks.run(other, compute=True, say=lambda _line: None)["reconstructed_start"] == [row]


def test_the_report_lies_beside_a_record_kept_elsewhere(setup, tmp_path):
    """A record kept outside the default place gets its report beside it, and the tracked report (under
    ``studies/results``, here the test's own) is not overwritten."""
    record = tmp_path / "elsewhere" / "benchmarks"
    benchmarks.main(["--report-only", "--tasks", "mnli", "--strategies", "cahp", "--record-dir", str(record)])
    assert {p.name for p in record.parent.iterdir()} >= {"benchmarks.json", "benchmarks.md", "benchmarks.png"}
    assert json.loads((record.parent / "benchmarks.json").read_text())["cells_done"] == 0
    assert not (common.RESULTS / "benchmarks.json").exists()
