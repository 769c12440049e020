"""``python -m studies budget``'s code paths on a tiny random model and a tiny SST-5-shaped dataset (the
study itself never runs in tests): every part, the rare-class copy, and a rerun that resumes from the cache."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from cahp_engine.models import save_pruned
from studies import budget_study, quality
from tests.support.tiny_models import make_classifier, make_texts, make_tokenizer

#: What makes a whole run on the tiny model take a second.
TINY_RUN = {"resolution": 6, "signature_samples": "all", "calibration_fraction": 1.0, "stability_shards": 0,
            "latency_warmup": 0, "latency_repeats": 1, "batch_size": 16, "max_length": 32}


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
                              cache=tmp_path / "cache", patience=1, epochs=1.0, lr=1e-3, device=torch.device("cpu"),
                              run_overrides=TINY_RUN)


def test_every_part_runs_and_a_rerun_resumes_from_the_cache(setup, monkeypatch):
    said: list[str] = []
    payload = budget_study.run(setup, budget_study.PARTS, compute=True, say=said.append)
    es = payload["early_stopping"]
    assert es["complete"] and len(es["cells"]) == 2 * len(budget_study.PATIENCES)
    fixed = [c for c in es["cells"] if c["patience"] == 0]
    watched = [c for c in es["cells"] if c["patience"] > 0]
    assert all(c["recovery"]["validation"] == [] for c in fixed)  # the paper's epochs read no validation
    assert all(c["recovery"]["validation"][0]["step"] == 0 and c["recovery"]["best_epoch"] is not None
               for c in watched)
    assert set(es["summary"]["2"]) == {"patience0", "patience1", "patience2"}
    runs = payload["budget"]
    assert set(runs) == set(budget_study.BUDGET_RUNS)
    assert runs["knee"]["budget"] is None and runs["knee"]["wall_vs_knee"] == 1.0
    assert all(runs[name]["budget"] is not None for name in budget_study.BUDGET_RUNS if name != "knee")
    assert runs["p1.0-macro-f1"]["status"] in ("succeeded", "failed")
    imbalanced = payload["imbalanced"]
    assert set(imbalanced) == set(budget_study.IMBALANCED_RUNS)
    text = budget_study.markdown({**payload, "date": "today", "command": "python -m studies budget"})
    assert "| p1.0 |" in text and "| d6-balanced |" in text and "patience1" in text

    # The rerun computes nothing: every cell and run is in the cache.
    def refuse(*_args, **_kwargs):
        raise AssertionError("a finished cell or run was computed again")

    monkeypatch.setattr(budget_study, "run_pruning", refuse)
    monkeypatch.setattr(budget_study, "recover_cell", refuse)
    again = budget_study.run(setup, budget_study.PARTS, compute=True, say=said.append)
    assert again["early_stopping"]["cells"] == es["cells"] and again["budget"] == runs


def test_the_rare_class_copy_keeps_its_share_and_leaves_the_other_splits(setup, tmp_path):
    target = budget_study.rare_class_copy(setup.data_dir, tmp_path / "rare", share=0.05)
    with (target / "train.csv").open() as handle:
        labels = [row["label"] for row in csv.DictReader(handle)]
    rest = sum(label != "0" for label in labels)
    assert labels.count("0") == round(0.05 * rest / 0.95) and rest == 120
    for split in ("validation", "test"):
        assert (target / f"{split}.csv").read_text() == (setup.data_dir / f"{split}.csv").read_text()
