"""The run-to-run agreement study's code path on a tiny random model (it never runs for real in tests)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from cahp_engine.models import save_pruned
from cahp_engine.selection import _convergence
from studies import agreement, common
from tests.support.tiny_models import WORDS, make_classifier, make_tokenizer


def _write_csv(path: Path, n: int, *, pairs: bool, seed: int) -> None:
    """Three classes whose labels are drawn independently of the texts."""
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text", "text2", "label"] if pairs else ["text", "label"])
        for i in range(n):
            words = [" ".join(WORDS[int(j)] for j in rng.integers(0, len(WORDS), size=int(rng.integers(3, 12))))
                     for _ in range(2 if pairs else 1)]
            writer.writerow([*words, int(rng.integers(0, 3)) if i >= 3 else i])


@pytest.fixture()
def tiny(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    base = tmp_path / "base"
    save_pruned(make_classifier("bert", num_labels=3, layers=3, heads=4), make_tokenizer(), base)
    for name, rows, pairs in (("single", 1500, False), ("pairs", 300, True)):
        _write_csv(tmp_path / name / "train.csv", rows, pairs=pairs, seed=rows)
        _write_csv(tmp_path / name / "test.csv", 30, pairs=pairs, seed=3)
    monkeypatch.setattr(common, "RESULTS", tmp_path / "results")
    # A signature noise share stuck at 0.7: a signal that stopped improving, what the plateau rule stops on.
    monkeypatch.setattr(_convergence, "class_difference_noise", lambda signatures, *, var_floor: 0.7)
    protocol = agreement.Protocol(
        tasks=(agreement.Task("single", str(tmp_path / "single")),
               agreement.parse_task(f"pairs={tmp_path / 'pairs'},pair=text2")),
        model="pretrained", pairs=2, plateau=("on", "off"), resolution=6, batch_size=32)
    return {"base": str(base), "cache": tmp_path / "cache", "protocol": protocol}


def _run(tiny: dict[str, object], **kwargs: object) -> dict:
    return agreement.run(tiny["protocol"], base=tiny["base"], cache=tiny["cache"],  # type: ignore[arg-type]
                         device=torch.device("cpu"), say=lambda _line: None, **kwargs)


def test_agreement_pairs_runs_that_differ_only_in_the_sample_order_and_resumes(tiny, monkeypatch):
    payload = _run(tiny)
    assert payload["complete"] and payload["methods"] == ["cahp", "coassociation", "stability-selection",
                                                          "mean-distance", "salience", "random"]
    for task in ("single", "pairs"):
        for plateau in ("on", "off"):
            block = payload["tasks"][task][plateau]
            runs = block["runs"]
            assert sorted(runs) == ["1", "2", "3", "4"]
            assert len({r["order_digest"] for r in runs.values()}) == 4  # four sample orders
            assert {r["config_seed"] for r in runs.values()} == {42}  # one seed for t-SNE and FasterPAM
            summary = block["summary"]
            assert summary["pairs"] == [[1, 2], [3, 4]]
            for degree in ("2", "6"):
                row = summary["degrees"][degree]
                assert len(row["k_star_difference"]["values"]) == 2
                assert all(v >= 0 for v in row["k_star_difference"]["values"])
                for method in agreement.METHODS:
                    values = row["methods"][method]["jaccard"]["values"]
                    assert len(values) == 2 and all(0.0 <= v <= 1.0 for v in values)
    # On 1,500 rows the plateau rule stops at the third checkpoint, and without it the pass reads every
    # row; 300 rows are fewer than the first rung either way.
    single = payload["tasks"]["single"]
    assert {r["signature_rows"] for r in single["on"]["runs"].values()} == {1152}
    assert single["on"]["summary"]["cost"]["signature_stopped"] == ["plateau"]
    assert {r["signature_rows"] for r in single["off"]["runs"].values()} == {1500}
    assert single["off"]["summary"]["cost"]["signature_stopped"] == ["cap"]
    assert {r["signature_rows"] for r in payload["tasks"]["pairs"]["on"]["runs"].values()} == {300}

    # A rerun computes nothing; a deleted run is computed again, identically (timings aside).
    calls = []
    real = agreement.analyze_heads

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(agreement, "analyze_heads", counting)
    again = _run(tiny)
    assert calls == [] and again["tasks"] == payload["tasks"]
    path = tiny["cache"] / "single" / "pretrained" / "plateau-off" / "order-seed3.json"
    before = json.loads(path.read_text())
    path.unlink()
    third = _run(tiny)
    assert calls == [1]
    after = json.loads(path.read_text())
    for volatile in ("analysis_s", "wall_s", "timings_s"):
        before.pop(volatile), after.pop(volatile)
    assert after == before
    assert third["tasks"]["single"]["off"]["summary"]["degrees"] == payload["tasks"]["single"]["off"]["summary"][
        "degrees"]
    table = agreement.markdown({**payload, "date": "d", "command": "c", "protocol": "p",
                                "machine": {"cpu": "x", "torch_threads": 1}})
    assert "| stability-selection |" in table and "single, plateau off, degree 6" in table


def test_a_task_names_its_directory_and_columns():
    task = agreement.parse_task("mrpc=/data/mrpc,pair=sentence2,text=sentence1")
    assert (task.name, task.path, task.text_column, task.text_pair_column) == ("mrpc", "/data/mrpc", "sentence1",
                                                                               "sentence2")
    assert task.options().text_pair_column == "sentence2"
    for bad in ("mrpc", "mrpc=/d,colour=red", "=/d"):
        with pytest.raises(SystemExit, match="--task"):
            agreement.parse_task(bad)
