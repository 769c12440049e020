"""The neuron-choice bench's code path on a tiny random model (it never runs for real in tests)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bench import neuron_choice
from tests.support.recovery import write_three_class_dataset
from tests.support.tiny_models import make_classifier, make_tokenizer

LAYERS = 2


def _argv(tmp_path: Path) -> list[str]:
    dense = tmp_path / "dense"
    make_classifier("bert", layers=LAYERS, heads=4, num_labels=3, seed=2).save_pretrained(dense)
    make_tokenizer().save_pretrained(dense)
    data = write_three_class_dataset(tmp_path / "data", {"train": (60, 0), "test": (30, 1)})
    torch.set_num_threads(1)
    return ["--dense", str(dense), "--data", str(data), "--target-flops", "0.5", "--batch", "4", "--seq-len", "16",
            "--tokens", "200", "--seeds", "3,4", "--out", str(tmp_path / "results" / "choice.json"),
            "--setting", "resolution=6", "--setting", "signature_samples=all", "--setting", "calibration_fraction=1.0",
            "--setting", "max_length=32", "--setting", "reconstruction_rows=40"]


def test_every_variant_fills_the_same_counts_and_a_rerun_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    argv = _argv(tmp_path)
    out = Path(argv[argv.index("--out") + 1])
    neuron_choice.main(argv)

    written = json.loads(out.read_text())
    cells = written["cells"]
    assert set(cells) == {f"seed {s}/{v}" for s in (3, 4) for v in neuron_choice.VARIANTS}
    for seed in (3, 4):
        shared = written["shared"][f"seed {seed}"]
        assert shared["tokens"] == 200
        counts = shared["neurons_per_layer"]
        importance = cells[f"seed {seed}/importance"]
        assert importance["flops_kept"] <= 0.5
        # The importance variant is the allocation's own choice; every variant keeps its counts and heads.
        assert importance["same_as_importance"] == counts and importance["identical_layers"] == LAYERS
        # No choice of as many neurons keeps more of a layer's importance than its most important ones.
        for variant in neuron_choice.VARIANTS:
            kept = cells[f"seed {seed}/{variant}"]["importance_kept"]
            assert all(k <= best + 1e-9 for k, best in zip(kept, importance["importance_kept"], strict=True))
        for variant in neuron_choice.VARIANTS:
            cell = cells[f"seed {seed}/{variant}"]
            assert cell["neurons_per_layer"] == counts
            assert cell["heads_per_layer"] == importance["heads_per_layer"]
            assert all(0 <= same <= count for same, count in zip(cell["same_as_importance"], counts, strict=True))
            for stage in ("as_cut", "reconstructed"):
                assert 0 <= cell[stage]["accuracy"] <= 1 and 0 <= cell[stage]["macro_f1"] <= 1
            assert cell["ffn_error_after"] >= 0
            assert all(0 <= share <= 1 + 1e-9 for share in cell["importance_kept"])
            assert all(0 <= active <= 1 for active in cell["active_kept"])
    capsys.readouterr()
    neuron_choice.main(argv)  # every cell is there: nothing is measured again
    assert "resuming: 8 cell(s)" in capsys.readouterr().out
    assert json.loads(out.read_text())["cells"] == cells


def test_the_cluster_choice_keeps_one_neuron_per_group_of_redundant_neurons() -> None:
    # Three groups of near-copies: 0-2, 3-5 and 6-7; the most important member of each is kept.
    rng = np.random.default_rng(0)
    base = rng.normal(size=(500, 3))
    profile = np.repeat(base, [3, 3, 2], axis=1) + 0.01 * rng.normal(size=(500, 8))
    corr = neuron_choice.abs_correlation(profile.astype(np.float32))
    importance = np.array([1.0, 5.0, 2.0, 9.0, 8.0, 7.0, 0.5, 0.6])
    assert neuron_choice.cluster_choice(corr, importance, 3, seed=0) == [1, 3, 7]
    # Importance alone keeps three copies of one group; the redundancy penalty moves on to the others.
    assert sorted(np.argsort(-importance)[:3].tolist()) == [3, 4, 5]
    assert neuron_choice.greedy_choice(corr, importance, 3) == [1, 3, 7]


def test_the_profiles_are_the_feed_forward_activations_of_the_drawn_real_tokens() -> None:
    model = make_classifier("bert", layers=LAYERS, heads=4, num_labels=3, seed=2).eval()
    ids = torch.randint(5, model.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    batches = [{"input_ids": ids[:1], "attention_mask": mask[:1]}, {"input_ids": ids[1:], "attention_mask": mask[1:]}]
    profiles = neuron_choice.ffn_profiles(model, batches, tokens=100, seed=0)  # more than there are: all 10
    # The intermediate module's own output, captured on a whole forward pass: the activations of every token.
    seen: list[torch.Tensor] = []
    handle = model.bert.encoder.layer[1].intermediate.register_forward_hook(lambda _m, _a, out: seen.append(out))
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    handle.remove()
    expected = seen[0][mask.bool()]
    assert len(profiles) == LAYERS and profiles[1].shape == (10, model.config.intermediate_size)
    np.testing.assert_allclose(profiles[1], expected.numpy(), rtol=1e-4, atol=1e-5)
    # Fewer tokens than there are: a draw of them, the same tokens in every layer, in their order.
    drawn = neuron_choice.ffn_profiles(model, batches, tokens=4, seed=1)
    rows = [int(np.argmin(np.abs(profiles[0] - row).sum(axis=1))) for row in drawn[0]]
    assert drawn[0].shape[0] == 4 and rows == sorted(set(rows))
    np.testing.assert_allclose(drawn[1], profiles[1][rows], rtol=1e-5, atol=1e-6)
