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


def _inputs(tmp_path: Path, *, head: float, neuron: float) -> tuple[list[str], CostModel, int]:
    """A tiny dense model, its data, and this machine's latency table for it as an earlier run leaves it
    (``head`` and ``neuron``: each unit's cost over all neurons' and heads' of a layer); the bench's argv.
    No corrections: a tiny model's timings are noise, and the allocation is then the table's."""
    dense = tmp_path / "dense"
    make_classifier("bert", layers=LAYERS, heads=HEADS, num_labels=3, seed=2).save_pretrained(dense)
    make_tokenizer().save_pretrained(dense)
    data = write_three_class_dataset(tmp_path / "data", {"train": (60, 0), "test": (30, 1)})
    out = tmp_path / "results" / "sides.json"
    torch.set_num_threads(1)
    model = load_classifier(str(dense), num_labels=3).model
    neurons = int(model.config.intermediate_size)
    table = CostModel(unit="seconds", fixed=0.001, attention=0.0, head=head / HEADS, ffn=0.0, neuron=neuron / neurons,
                      num_layers=LAYERS, num_heads=HEADS, num_neurons=neurons, batch_size=BATCH, seq_len=SEQ_LEN,
                      runtime="pytorch", points=8, fit_error=0.0)
    _write_cache(out.parent / "cache" / "latency", _cache_key(model, batch_size=BATCH, seq_len=SEQ_LEN,
                                                              runtime="pytorch"), table)
    argv = ["--dense", str(dense), "--data", str(data), "--target", "1.5", "--batch", str(BATCH), "--seq-len",
            str(SEQ_LEN), "--repeats", "1", "--corrections", "0", "--seeds", "3,4", "--out", str(out),
            "--setting", "resolution=6", "--setting", "signature_samples=all", "--setting", "calibration_fraction=1.0",
            "--setting", "max_length=32"]
    return argv, table, neurons


def test_the_three_arms_are_measured_side_by_side_and_a_rerun_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    # Heads cost little next to neurons: heads alone cannot reach x1.5, heads and neurons can (x5 at most).
    argv, table, neurons = _inputs(tmp_path, head=0.00004, neuron=0.002)
    argv.append("--ffn-block")
    out = Path(argv[argv.index("--out") + 1])
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
            for stage in ("as_cut", "reconstructed", "reconstructed_ffn_block"):
                assert 0 <= cell[stage]["accuracy"] <= 1 and 0 <= cell[stage]["macro_f1"] <= 1
            # The run's refit matches each feed-forward block's sum with its residual; the arm asked for
            # refits the same cut with the block's own output as the target.
            assert "feed-forward residual" in cell["reconstruction"]
            assert "feed-forward block" in cell["reconstruction_ffn_block"]

    capsys.readouterr()
    target_sides.main(argv)  # every cell is there: nothing is measured again
    assert "resuming: 8 cell(s)" in capsys.readouterr().out
    assert json.loads(out.read_text())["cells"] == cells


def test_heads_only_is_pruned_to_the_target_where_heads_alone_reach_it(tmp_path: Path) -> None:
    # Heads cost most: removing heads alone reaches x1.5.
    argv, table, neurons = _inputs(tmp_path, head=0.004, neuron=0.0004)
    target_sides.main([*argv[:argv.index("--seeds") + 1], "3", *argv[argv.index("--seeds") + 2:]])
    out = Path(argv[argv.index("--out") + 1])
    only = json.loads(out.read_text())["cells"]["seed 3/heads_only"]
    assert only["reachable"] is True and only["reachable_speedup"] > 1.5
    assert only["neurons_per_layer"] == [neurons] * LAYERS and only["neurons_removed"] == 0
    assert sum(only["heads_per_layer"]) < LAYERS * HEADS and only["predicted_speedup"] >= 1.5
    assert 0 <= only["reconstructed"]["accuracy"] <= 1
