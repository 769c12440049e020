"""``python -m studies budget``'s code paths on a tiny random model and a tiny SST-5-shaped dataset (the
study itself never runs in tests): every part, the rare-class copy, and a rerun that resumes from the cache."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import torch

from cahp_engine.models import save_pruned
from studies import budget_study, quality
from tests.support.tiny_models import make_classifier, make_texts, make_tokenizer

#: What makes a whole run on the tiny model take a second.
TINY_RUN = {"resolution": 6, "signature_samples": "all", "calibration_fraction": 1.0, "stability_shards": 0,
            "latency_warmup": 0, "latency_repeats": 1, "batch_size": 16, "max_length": 32,
            "untrained_dense": "warn"}  # the tiny random model stands for the study's fine-tuned dense one


def _write_split(path: Path, n: int, seed: int) -> None:
    texts, labels = make_texts(n, num_classes=5, seed=seed)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows(zip(texts, labels.tolist(), strict=True))


@pytest.fixture()
def setup(tmp_path: Path) -> budget_study.Setup:
    data = tmp_path / "data"
    data.mkdir()
    for split, n, seed in (("train", 150, 1), ("validation", 50, 3), ("test", 50, 2)):
        _write_split(data / f"{split}.csv", n, seed)
    base = tmp_path / "base"
    save_pruned(make_classifier("bert", num_labels=5, layers=3, heads=4), make_tokenizer(), base)
    protocol = quality.Protocol(name="tiny", model="tiny", seeds=(1, 2), degrees=(2,), dense_epochs=2, dense_lr=2e-3,
                                recovery_lr=1e-3, dense_cpu_path="native", resolution=6)
    return budget_study.Setup(protocol=protocol, base=str(base), data_dir=data, quality_cache=tmp_path / "quality",
                              cache=tmp_path / "cache", record=tmp_path / "record", patience=1, epochs=1.0, lr=1e-3,
                              device=torch.device("cpu"),
                              run_overrides=TINY_RUN)


def test_every_part_runs_and_a_rerun_resumes_from_the_cache(setup, monkeypatch):
    said: list[str] = []
    payload = budget_study.run(setup, budget_study.PARTS, compute=True, say=said.append)
    es = payload["early_stopping"]
    assert es["complete"] and len(es["cells"]) == 2
    assert all([s["point"]["step"] for s in c["stops"]][0] == 0 and len(c["stops"]) == 2 for c in es["cells"])
    assert len(es["recoveries"]) == 2 * len(budget_study.RECOVERIES)
    fixed = [r for r in es["recoveries"] if r["recovery"] == "fixed"]
    assert all(r["best_epoch"] is None and r["epochs"] == 1.0 for r in fixed)  # the paper's: the last weights
    assert set(es["summary"]["2"]) == set(budget_study.RECOVERIES)
    start = payload["reconstructed_start"]
    assert start["complete"] and len(start["cells"]) == 2
    assert all(c["reconstruction"]["sentences"] > 0 and "layer-wise reconstruction" in c["reconstruction"]["summary"]
               for c in start["cells"])
    assert all(c["reconstruction"] is None for c in es["cells"])
    # the reconstructed start changes the model the recovery begins from
    assert all(a["loss_per_epoch"] != b["loss_per_epoch"] for a, b in zip(start["cells"], es["cells"], strict=True))
    # the recorded part refits the attention alone; its -ffn twin starts from the run's reconstruction
    ffn = payload["reconstructed_start_ffn"]
    assert ffn["complete"] and len(ffn["cells"]) == 2
    assert all("feed-forward" not in c["reconstruction"]["summary"] for c in start["cells"])
    assert all("feed-forward residual" in c["reconstruction"]["summary"] for c in ffn["cells"])
    runs = payload["budget"]
    assert set(runs) == set(budget_study.BUDGET_RUNS)
    assert runs["knee"]["budget"] is None and runs["knee"]["wall_vs_knee"] == 1.0
    assert all((runs[name]["budget"] is not None) == name.startswith("p") for name in budget_study.BUDGET_RUNS)
    assert runs["reconstruct"]["recovery_epochs"] == 0 and runs["reconstruct+finetune-1ep"]["recovery_epochs"] == 1
    judged = runs["p1.0-judged"]["budget"]
    assert {c["strategy"] for c in judged["candidates"]} <= {"cahp", "salience", "cahp-layer-salience"}
    assert runs["p1.0-macro-f1"]["status"] in ("succeeded", "failed")
    imbalanced = payload["imbalanced"]
    assert set(imbalanced) == set(budget_study.IMBALANCED_RUNS)
    text = budget_study.markdown({**payload, "date": "today", "command": "python -m studies budget"})
    assert "| p1.0 |" in text and "| d6-balanced |" in text and "patience1" in text and "best-of-3" in text
    assert "Recovery from the reconstructed model (the attention refit alone)" in text
    assert "Recovery from the reconstructed model (the run's reconstruction" in text

    # The rerun computes nothing: every cell and run is in the cache.
    def refuse(*_args, **_kwargs):
        raise AssertionError("a finished cell or run was computed again")

    monkeypatch.setattr(budget_study, "run_pruning", refuse)
    monkeypatch.setattr(budget_study, "recover_curve", refuse)
    again = budget_study.run(setup, budget_study.PARTS, compute=True, say=said.append)
    assert again["early_stopping"]["cells"] == es["cells"] and again["budget"] == runs
    assert again["reconstructed_start"]["cells"] == start["cells"]
    assert again["reconstructed_start_ffn"]["cells"] == ffn["cells"]
    # ... also from the record alone (another session: the cache of models and run directories is gone).
    shutil.rmtree(setup.cache)
    again = budget_study.run(setup, budget_study.PARTS, compute=True, say=said.append)
    assert again["budget"] == runs and again["imbalanced"] == imbalanced
    assert not (setup.cache / "imbalanced" / "dense").exists()  # every run recorded: no model needed

    # A retrained rare-class model that differs from the recorded one is refused: its runs would mix two models.
    recorded = setup.record / "imbalanced" / "dense.json"
    doc = json.loads(recorded.read_text())
    doc["test"]["confusion"][0][0] += 1
    recorded.write_text(json.dumps(doc))
    (setup.record / "imbalanced" / "d6-none.json").unlink()  # a run still to do
    with pytest.raises(SystemExit, match="is not the one the recorded imbalanced runs pruned"):
        budget_study.run(setup, ("imbalanced",), compute=True, say=said.append)
    assert not (setup.cache / "imbalanced" / "dense").exists()


def test_a_recovery_read_off_the_never_stopped_run_follows_the_engines_rule():
    def stop(step: int, score: float, accuracy: float) -> dict:
        return {"point": {"step": step, "epoch": step / 10, "score": score, "accuracy": score, "macro_f1": score,
                          "lost_classes": []}, "train_s": 0.0 if step == 0 else 10.0, "validation_s": 1.0,
                "test": {"accuracy": accuracy}}

    stops = [stop(0, 0.40, 0.41), stop(10, 0.50, 0.52), stop(20, 0.45, 0.49), stop(30, 0.48, 0.50)]
    fixed = budget_study.derive(stops, 30, 0, keep_best=False)
    assert fixed["test"]["accuracy"] == 0.50 and fixed["recovery_s"] == 30.0 and not fixed["stopped_early"]
    best = budget_study.derive(stops, 30, 0, keep_best=True)
    assert best["test"]["accuracy"] == 0.52 and best["best_epoch"] == 1.0 and best["recovery_s"] == 34.0
    one = budget_study.derive(stops, 30, 1, keep_best=True)  # epoch 2 brought no gain: stopped there
    assert one["stopped_early"] and one["epochs"] == 2.0 and one["recovery_s"] == 23.0
    assert one["test"]["accuracy"] == 0.52
    two = budget_study.derive(stops, 30, 2, keep_best=True)  # the last evaluation ends it anyway
    assert not two["stopped_early"] and two["epochs"] == 3.0 and two["best_epoch"] == 1.0


def test_the_rare_class_copy_keeps_its_share_and_leaves_the_other_splits(setup, tmp_path):
    target = budget_study.rare_class_copy(setup.data_dir, tmp_path / "rare", share=0.05)
    with (target / "train.csv").open() as handle:
        labels = [row["label"] for row in csv.DictReader(handle)]
    rest = sum(label != "0" for label in labels)
    assert labels.count("0") == round(0.05 * rest / 0.95) and rest == 120
    for split in ("validation", "test"):
        assert (target / f"{split}.csv").read_text() == (setup.data_dir / f"{split}.csv").read_text()
