import numpy as np
import pytest

from cahp_engine.errors import ConfigError
from cahp_engine.selection import select_random, select_representatives, select_top_salience


def test_representative_is_the_most_salient_member_of_each_cluster():
    salience = np.array([[0.1, 0.9, 0.3], [0.5, 0.2, 0.8]])
    labels = np.array([0, 0, 1, 1, 2, 2])  # heads l*H+h
    sel = select_representatives(labels, salience)
    assert sel.representatives == ((0, 1), (1, 0), (1, 2))
    assert sel.kept == {0: [1], 1: [0, 2]}
    assert sel.layer_safety_added == ()
    assert sel.num_kept == 3 and sel.retention == pytest.approx(0.5)


def test_layer_safety_keeps_the_most_salient_head_of_an_empty_layer():
    salience = np.array([[0.1, 0.2, 0.05], [0.9, 0.8, 1.0], [0.3, 0.6, 0.4]])
    labels = np.array([0, 0, 0, 0, 1, 1, 0, 0, 1])  # every representative lands in layer 1
    sel = select_representatives(labels, salience)
    assert sel.representatives == ((1, 0), (1, 2))
    assert sel.layer_safety_added == ((0, 1), (2, 1))
    assert sel.kept == {0: [1], 1: [0, 2], 2: [1]}
    assert select_representatives(labels, salience, layer_safety=False).kept == {0: [], 1: [0, 2], 2: []}


def test_baselines_keep_exactly_the_requested_count():
    salience = np.random.default_rng(0).random((4, 6))
    top = select_top_salience(salience, 5)
    assert top.num_kept == 5
    assert set(salience[top.kept_mask]) == set(np.sort(salience.reshape(-1))[-5:])
    r1, r2, r3 = (select_random((4, 6), 7, seed=s) for s in (1, 1, 2))
    assert r1.num_kept == 7
    np.testing.assert_array_equal(r1.kept_mask, r2.kept_mask)
    assert not np.array_equal(r1.kept_mask, r3.kept_mask)
    with pytest.raises(ConfigError, match="between 1 and 24"):
        select_top_salience(salience, 0)
