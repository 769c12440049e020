"""The consensus strategies: CAHP's choice combined over the full analysis and its leave-one-shard-out ones."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from cahp_engine.config import CONSENSUS_STRATEGIES, PruningConfig
from cahp_engine.data import LabelledTexts, encode
from cahp_engine.run import RunReport, RunRequest, run_pruning
from cahp_engine.selection import (
    analyze_heads,
    choose,
    co_association,
    consensus_runs,
    jaccard,
    kept_frequency,
    mean_graph_distance,
    select_heads,
    select_most_frequent,
)
from tests.support.tiny_models import make_classifier, make_texts, make_tokenizer

CONFIG = PruningConfig(resolution=6, seed=5)


def _data(n: int = 150, seed: int = 3):
    texts, labels = make_texts(n, num_classes=3, seed=seed)
    return encode(make_tokenizer(), LabelledTexts(tuple(texts), labels, ("a", "b", "c")), max_length=32)


@pytest.fixture(scope="module")
def setup():
    model = make_classifier("bert", layers=3, heads=4, seed=1)
    data = _data()
    return model, data, analyze_heads(model, data, CONFIG)


def _identical_runs(analysis):
    """An analysis whose K leave-one-out analyses are all the full one: nothing to disagree about."""
    alone = dataclasses.replace(analysis, leave_one_out=())
    return dataclasses.replace(analysis, leave_one_out=(alone,) * len(analysis.leave_one_out))


@pytest.mark.parametrize("method", CONSENSUS_STRATEGIES)
def test_each_consensus_is_deterministic_for_a_seed_and_keeps_every_layer(setup, method):
    model, data, analysis = setup
    assert len(analysis.leave_one_out) == 5
    again = analyze_heads(model, data, CONFIG)
    for k in (1, 2, 4, 7, 11):
        chosen = choose(analysis, k, method, seed=5)
        repeat = choose(again, k, method, seed=5)
        np.testing.assert_array_equal(chosen.kept_mask, repeat.kept_mask)
        assert chosen.consensus == dataclasses.replace(repeat.consensus, seconds=chosen.consensus.seconds)
        assert chosen.strategy == method and len(chosen.representatives) == k
        # Layer safety as CAHP's: every layer keeps a head, the added ones are their layer's most salient.
        assert chosen.kept_mask.any(axis=1).all()
        for layer, head in chosen.layer_safety_added:
            assert head == int(np.argmax(analysis.salience[layer]))
            assert all(rep[0] != layer for rep in chosen.representatives)
        assert chosen.num_kept == k + len(chosen.layer_safety_added)
    # k = 1 on three layers: two of them are kept by layer safety alone.
    assert len(choose(analysis, 1, method, seed=5).layer_safety_added) == 2


@pytest.mark.parametrize("method", CONSENSUS_STRATEGIES)
def test_a_consensus_of_identical_runs_is_cahps_own_choice(setup, method):
    _, _, analysis = setup
    same = _identical_runs(analysis)
    for k in (1, 2, 3, 5, 8, 11):
        cahp = choose(same, k, "cahp")
        chosen = choose(same, k, method, seed=5)
        np.testing.assert_array_equal(chosen.kept_mask, cahp.kept_mask)
        assert chosen.layer_safety_added == cahp.layer_safety_added
        assert chosen.consensus.mean_jaccard == chosen.consensus.jaccard_to_single_run == 1.0


@pytest.mark.parametrize("method", CONSENSUS_STRATEGIES)
def test_without_leave_one_out_analyses_a_consensus_is_the_single_run(setup, method):
    model, data, analysis = setup
    alone = dataclasses.replace(analysis, leave_one_out=())
    for k in (2, 4, 6):
        chosen = choose(alone, k, method, seed=5)
        cahp = choose(alone, k, "cahp")
        np.testing.assert_array_equal(chosen.kept_mask, cahp.kept_mask)
        assert chosen.strategy == "cahp" and chosen.consensus is None
    result = select_heads(model, data, CONFIG.replace(strategy=method, stability_shards=0))
    single = select_heads(model, data, CONFIG.replace(stability_shards=0))
    np.testing.assert_array_equal(result.selection.kept_mask, single.selection.kept_mask)
    assert result.selection.consensus is None and result.stability is None
    assert any(f"`{method}` consensus" in w and "stability_shards" in w for w in result.warnings)
    assert not any("consensus" in w for w in single.warnings)


def test_the_consensus_record_describes_the_runs_it_combined(setup):
    model, data, analysis = setup
    k = analysis.knees[CONFIG.poly_degree].k
    runs = consensus_runs(analysis)
    assert runs[0] is analysis and runs[1:] == analysis.leave_one_out
    masks = np.stack([choose(run, k, "cahp").kept_mask for run in runs])
    chosen = choose(analysis, k, "coassociation", seed=5)
    record = chosen.consensus
    assert (record.method, record.runs, record.k) == ("coassociation", 6, k)
    pairs = [jaccard(a, b) for a, b in itertools.combinations(masks, 2)]
    assert record.mean_jaccard == pytest.approx(np.mean(pairs)) and record.min_jaccard == min(pairs)
    assert record.jaccard_to_single_run == jaccard(chosen.kept_mask, masks[0])
    np.testing.assert_allclose(record.kept_frequency, masks.mean(axis=0))
    np.testing.assert_allclose(kept_frequency(masks), masks.mean(axis=0))
    assert record.seconds > 0
    # select_heads carries the record next to the stability measure of CAHP's single-run rule.
    result = select_heads(model, data, CONFIG.replace(strategy="coassociation"))
    np.testing.assert_array_equal(result.selection.kept_mask, chosen.kept_mask)
    assert result.selection.consensus == dataclasses.replace(record, seconds=result.selection.consensus.seconds)
    assert result.stability is not None and result.selection.strategy == "coassociation"


def test_co_association_and_mean_distance_from_the_runs(setup):
    _, _, analysis = setup
    runs = consensus_runs(analysis)
    together = co_association(runs, 4)
    labels = np.stack([run.labels(4) for run in runs])
    assert together.shape == (12, 12) and np.allclose(together, together.T)
    assert (np.diag(together) == 1).all()
    i, j = 0, 5
    assert together[i, j] == pytest.approx(np.mean(labels[:, i] == labels[:, j]))
    assert set(np.round(together.ravel() * 6).astype(int)) <= set(range(7))
    distances = mean_graph_distance(runs)
    assert distances.shape == (12, 12) and np.allclose(distances, distances.T) and (np.diag(distances) == 0).all()
    # Each layout is scaled to a mean off-diagonal distance of one before averaging.
    assert distances.sum() / (12 * 11) == pytest.approx(1.0)
    scaled = dataclasses.replace(analysis, graph_space=dataclasses.replace(
        analysis.graph_space, points=analysis.graph_space.points * 7.5))
    np.testing.assert_allclose(mean_graph_distance((scaled,)), mean_graph_distance((analysis,)))


def test_stability_selection_keeps_the_most_frequent_heads_ties_by_salience():
    salience = np.array([[0.9, 0.1, 0.5], [0.2, 0.8, 0.3], [0.4, 0.6, 0.7]])
    frequency = np.array([[1.0, 1.0, 0.5], [0.5, 0.0, 0.0], [0.0, 0.0, 0.0]])
    chosen = select_most_frequent(frequency, salience, 3)
    # (0, 0) and (0, 1) always chosen; of the two at 0.5, (0, 2) is more salient than (1, 0).
    assert chosen.representatives == ((0, 0), (0, 1), (0, 2))
    # Layers 1 and 2 would be empty: their most salient heads are added.
    assert chosen.layer_safety_added == ((1, 1), (2, 2)) and chosen.num_kept == 5
    with pytest.raises(ValueError, match="frequency must have the shape"):
        select_most_frequent(frequency[:2], salience, 3)


def test_a_run_with_a_consensus_reports_it_in_the_report_and_the_head_map(tmp_path: Path):
    from tests.engine.golden.make_golden import write_inputs

    model, data = write_inputs(tmp_path)
    config = PruningConfig(epochs=0.25, dense_finetune="never", untrained_dense="warn", batch_size=16, max_length=32,
                           seed=3, device="cpu",
                           latency_warmup=0, latency_repeats=1, export="none", recovery_loss="ce",
                           strategy="stability-selection")
    report = run_pruning(RunRequest(model_ref=str(model), dataset_ref=str(data), output_dir=tmp_path / "out",
                                    config=config))
    written = json.loads((tmp_path / "out" / "report.json").read_text())
    assert RunReport.from_dict(written) == report
    consensus = written["selection"]["consensus"]
    assert list(consensus) == ["method", "runs", "k", "mean_jaccard", "min_jaccard", "jaccard_to_single_run",
                               "kept_frequency", "seconds"]
    assert consensus["method"] == written["selection"]["strategy"] == "stability-selection"
    assert consensus["runs"] == 6 and consensus["k"] == written["selection"]["k_star"]
    assert np.asarray(consensus["kept_frequency"]).shape == (3, 4)
    head_map = json.loads((tmp_path / "out" / "head_map.json").read_text())
    assert head_map["consensus"] == consensus
    # Five panels: kept, salience, cluster, the leave-one-shard-out stability and the consensus's runs.
    import matplotlib.image

    five = matplotlib.image.imread(tmp_path / "out" / "head_map.png").shape[1]
    plain = run_pruning(RunRequest(model_ref=str(model), dataset_ref=str(data), output_dir=tmp_path / "plain",
                                   config=config.replace(strategy="cahp")))
    assert plain.selection.consensus is None
    assert json.loads((tmp_path / "plain" / "head_map.json").read_text())["consensus"] is None
    four = matplotlib.image.imread(tmp_path / "plain" / "head_map.png").shape[1]
    # A panel of 4 heads is 4 cells of 2.2 / 4 inches plus 1.2 inches of colour bar, at 110 dpi.
    assert five - four == pytest.approx((4 * 2.2 / 4 + 1.2) * 110, abs=2)
