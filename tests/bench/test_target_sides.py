"""The side-by-side target bench's code path on a tiny random model (it never runs for real in tests)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bench import target_sides
from cahp_engine.allocation import CostModel
from cahp_engine.allocation._costs import _cache_key, _write_cache
from cahp_engine.models import load_classifier
from tests.support.recovery import write_three_class_dataset
from tests.support.tiny_models import make_classifier, make_tokenizer

BATCH, SEQ_LEN, LAYERS, HEADS = 4, 16, 2, 4


def test_the_three_arms_are_measured_side_by_side_and_a_rerun_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    dense = tmp_path / "dense"
    make_classifier("bert", layers=LAYERS, heads=HEADS, num_labels=3, seed=2).save_pretrained(dense)
    make_tokenizer().save_pretrained(dense)
    data = write_three_class_dataset(tmp_path / "data", {"train": (60, 0), "test": (30, 1)})
    out = tmp_path / "results" / "sides.json"
    # This machine's table, as an earlier run leaves it: heads cost little next to neurons, so heads alone
    # cannot reach x1.5 while heads and neurons can (x5 at most). No corrections: a tiny model's timings are
    # noise, and the allocation is then the table's.
    torch.set_num_threads(1)
    model = load_classifier(str(dense), num_labels=3).model
    neurons = int(model.config.intermediate_size)
    table = CostModel(unit="seconds", fixed=0.001, attention=0.0, head=0.00001, ffn=0.0, neuron=0.002 / neurons,
                      num_layers=LAYERS, num_heads=HEADS, num_neurons=neurons, batch_size=BATCH, seq_len=SEQ_LEN,
                      runtime="pytorch", points=8, fit_error=0.0)
    _write_cache(out.parent / "cache" / "latency", _cache_key(model, batch_size=BATCH, seq_len=SEQ_LEN,
                                                              runtime="pytorch"), table)
    argv = ["--dense", str(dense), "--data", str(data), "--target", "1.5", "--batch", str(BATCH), "--seq-len",
            str(SEQ_LEN), "--repeats", "1", "--corrections", "0", "--seeds", "3,4", "--out", str(out),
            "--setting", "resolution=6", "--setting", "signature_samples=all", "--setting", "calibration_fraction=1.0",
            "--setting", "max_length=32"]
    target_sides.main(argv)

    written = json.loads(out.read_text())
    cells = written["cells"]
    assert set(cells) == {f"seed {s}/{arm}" for s in (3, 4)
                          for arm in ("heads_only", "heads_only_fastest", "cahp", "salience")}
    assert 0 <= written["dense_accuracy"]["accuracy"] <= 1
    for seed in (3, 4):
        only = cells[f"seed {seed}/heads_only"]
        assert only["reachable"] is False and only["reachable_speedup"] == pytest.approx(table.dense / (
            table.fixed + LAYERS * (table.head + table.neuron * neurons)))
        fastest = cells[f"seed {seed}/heads_only_fastest"]
        assert fastest["heads_per_layer"] == [1] * LAYERS and fastest["neurons_per_layer"] == [neurons] * LAYERS
        cahp, salience = cells[f"seed {seed}/cahp"], cells[f"seed {seed}/salience"]
        assert sum(cahp["neurons_per_layer"]) < LAYERS * neurons  # neurons removed to reach the target
        # The same allocation, the heads chosen otherwise.
        assert salience["heads_per_layer"] == cahp["heads_per_layer"]
        assert salience["neurons_per_layer"] == cahp["neurons_per_layer"]
        assert salience["flops_kept"] == cahp["flops_kept"] < 1
        for cell in (fastest, cahp, salience):
            assert cell["measured_speedup"] > 0
            for stage in ("as_cut", "reconstructed"):
                assert 0 <= cell[stage]["accuracy"] <= 1 and 0 <= cell[stage]["macro_f1"] <= 1

    capsys.readouterr()
    target_sides.main(argv)  # every cell is there: nothing is measured again
    assert "resuming: 8 cell(s)" in capsys.readouterr().out
    assert json.loads(out.read_text())["cells"] == cells
