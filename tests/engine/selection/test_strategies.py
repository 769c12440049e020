"""The analysis once, then any strategy's choice; the strategy table; the importance protocol."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import torch

from cahp_engine._strategy_names import STRATEGY_MODULES
from cahp_engine.config import CONSENSUS_STRATEGIES, STRATEGIES, PruningConfig
from cahp_engine.data import LabelledTexts, encode
from cahp_engine.errors import ConfigError, PipelineError
from cahp_engine.selection import (
    Selection,
    analyze_heads,
    choose,
    get_strategy,
    gradient_salience,
    minmax,
    select_heads,
    select_top_salience,
)
from cahp_engine.selection import _strategies as strategies
from tests.support.tiny_models import make_classifier, make_texts, make_tokenizer

CONFIG = PruningConfig(resolution=6, seed=5)


@pytest.fixture(scope="module")
def setup():
    texts, labels = make_texts(90, num_classes=3, seed=3)
    data = encode(make_tokenizer(), LabelledTexts(tuple(texts), labels, ("a", "b", "c")), max_length=32)
    model = make_classifier("bert", layers=3, heads=4, seed=1)
    return model, data, analyze_heads(model, data, CONFIG)


def test_the_table_names_the_strategies_the_config_accepts():
    assert STRATEGIES == ("cahp", "salience", "random", "coassociation", "stability-selection",
                          "mean-distance", "cahp-layer-salience") == tuple(STRATEGY_MODULES)
    assert CONSENSUS_STRATEGIES == STRATEGIES[3:6]
    for name in STRATEGIES:
        assert PruningConfig(strategy=name).strategy == name
    with pytest.raises(ConfigError, match="`strategy` must be one of cahp, salience, random, coassociation, "
                                          "stability-selection, mean-distance, cahp-layer-salience, got 'magnitude'"):
        get_strategy("magnitude")


def test_select_heads_is_the_analysis_then_the_choice(setup):
    model, data, analysis = setup
    for changes in ({}, {"strategy": "salience"}, {"strategy": "random", "heads_to_keep": 7}, {"heads_to_keep": 1}):
        config = CONFIG.replace(**changes)
        result = select_heads(model, data, config)
        k = config.heads_to_keep or analysis.knees[config.poly_degree].k
        chosen = choose(analysis, k, config.strategy, count=config.heads_to_keep, seed=config.seed)
        np.testing.assert_array_equal(result.selection.kept_mask, chosen.kept_mask)
        assert result.selection.representatives == chosen.representatives
        np.testing.assert_array_equal(result.analysis.salience, analysis.salience)
        np.testing.assert_array_equal(result.analysis.curve.mss, analysis.curve.mss)


def test_baselines_keep_cahps_count_at_the_same_k_unless_told(setup):
    _, _, analysis = setup
    for k in (1, 2, 5, 11):
        cahp = choose(analysis, k)
        assert len(cahp.representatives) == k and cahp.strategy == "cahp"
        for name in ("salience", "random"):
            assert choose(analysis, k, name, seed=1).num_kept == cahp.num_kept
        assert choose(analysis, k, "salience", count=3).num_kept == 3
    np.testing.assert_array_equal(choose(analysis, 4, "salience", count=6).kept_mask,
                                  select_top_salience(analysis.salience, 6).kept_mask)
    assert analysis.partition(1) is None and analysis.labels(1).tolist() == [0] * 12
    assert analysis.partition(4).k == 4 and analysis.shape == (3, 4)


def test_a_baseline_is_one_module_and_one_table_entry(setup, monkeypatch):
    _, _, analysis = setup
    module = types.ModuleType("tests_first_heads")

    def first(analysis, k, *, count, seed):
        mask = np.zeros(analysis.shape, dtype=bool)
        mask.reshape(-1)[:count] = True
        return Selection(kept_mask=mask, representatives=(), layer_safety_added=(), strategy="first")

    module.choose = first  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(strategies.STRATEGY_MODULES, "first", module.__name__)
    chosen = choose(analysis, 3, "first")
    assert chosen.strategy == "first" and chosen.num_kept == choose(analysis, 3).num_kept
    assert chosen.kept_mask.reshape(-1)[: chosen.num_kept].all()


def test_the_importance_is_any_head_importance(setup):
    model, data, analysis = setup
    seen = []

    def weight_norm(model, batches):
        seen.extend(batch["labels"].numel() for batch in batches)
        layers = model.bert.encoder.layer
        return torch.stack([layer.attention.output.dense.weight.abs().reshape(-1, 4, 8).sum(dim=(0, 2))
                            for layer in layers])

    stages = []
    other = analyze_heads(model, data, CONFIG, importance=weight_norm, progress=lambda s, f: stages.append((s, f)))
    assert sum(seen) == other.calibration_samples
    expected = weight_norm(model, []).detach().double()
    np.testing.assert_allclose(other.salience_raw, expected.numpy())
    np.testing.assert_allclose(other.salience, minmax(expected).numpy())
    assert ("salience", 1.0) in stages and other.salience.max() == 1.0
    np.testing.assert_array_equal(other.curve.mss, analysis.curve.mss)  # the clustering does not depend on it
    default = analyze_heads(model, data, CONFIG, importance=gradient_salience)
    np.testing.assert_array_equal(default.salience_raw, analysis.salience_raw)
    with pytest.raises(PipelineError, match="one score per head"):
        analyze_heads(model, data, CONFIG, importance=lambda model, batches: torch.zeros(2, 2))


def test_cahp_layer_salience_keeps_cahps_layer_counts_filled_by_salience(setup):
    _, _, analysis = setup
    k = analysis.knees[2].k
    cahp = choose(analysis, k, "cahp", seed=5)
    chosen = choose(analysis, k, "cahp-layer-salience", seed=5)
    assert chosen.strategy == "cahp-layer-salience" and chosen.layer_safety_added == ()
    np.testing.assert_array_equal(chosen.kept_mask.sum(axis=1), cahp.kept_mask.sum(axis=1))
    salience = np.asarray(analysis.salience)
    for layer, row in enumerate(chosen.kept_mask):
        if row.any() and not row.all():  # every kept head outranks every dropped one in its layer
            assert salience[layer][row].min() >= salience[layer][~row].max()
    assert PruningConfig(budget_strategies=("cahp", "cahp-layer-salience")).budget_strategies[1] == \
        "cahp-layer-salience"
