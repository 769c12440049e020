import itertools
import math

import numpy as np
import pytest

from cahp_engine.selection import Signatures, bhattacharyya_normal, jeffries_matusita, separation_features


def test_identical_distributions_have_zero_distance():
    mu = np.array([0.3, 0.1])
    var = np.array([0.02, 0.5])
    b = bhattacharyya_normal(mu, var, mu, var)
    assert np.allclose(b, 0.0)
    assert np.allclose(jeffries_matusita(b), 0.0)


def test_bhattacharyya_against_a_value_worked_by_hand():
    # mu1=0, mu2=1, var1=1, var2=3: (1)^2 / (4 * 4) + 0.5 ln(4 / (2 sqrt 3)) = 0.0625 + 0.5 ln(1.1547)
    expected = 0.0625 + 0.5 * math.log(4 / (2 * math.sqrt(3)))
    b = bhattacharyya_normal(np.array(0.0), np.array(1.0), np.array(1.0), np.array(3.0))
    assert float(b) == pytest.approx(expected, rel=1e-12)
    assert float(jeffries_matusita(b)) == pytest.approx(2 * (1 - math.exp(-expected)), rel=1e-12)


def test_far_apart_distributions_approach_two():
    jm = jeffries_matusita(bhattacharyya_normal(np.array(0.0), np.array(1e-4), np.array(1.0), np.array(1e-4)))
    assert 2.0 - float(jm) < 1e-12
    assert float(jm) <= 2.0


def test_feature_matrix_layout_and_variance_floor():
    rng = np.random.default_rng(0)
    c, n, bb = 4, 6, 9
    mean = rng.random((c, n, bb))
    var = rng.random((c, n, bb)) * 0.1
    var[:, 0, 0] = 0.0  # a pixel that never varies
    mean[:, 0, 0] = 0.5  # ... and has the same value in every class
    var[:, 1, 0] = 0.0
    mean[:, 1, 0] = np.arange(c)  # never varies, differs between classes
    sig = Signatures(mean=mean, var=var, counts=np.full(c, 10), resolution=3, num_layers=2, num_heads=3)
    feats = separation_features(sig, var_floor=1e-10)
    pairs = list(itertools.combinations(range(c), 2))
    assert feats.pairs == tuple(pairs)
    assert feats.matrix.shape == (n, len(pairs) * bb)
    assert np.isfinite(feats.matrix).all()
    assert feats.matrix.min() >= 0 and feats.matrix.max() <= 2
    # Block p of row h holds the JM of pair p over the B*B pixels.
    p = 4
    i, j = pairs[p]
    v = np.maximum(var, 1e-10)
    expected = jeffries_matusita(bhattacharyya_normal(mean[i, 3], v[i, 3], mean[j, 3], v[j, 3]))
    assert np.allclose(feats.matrix[3, p * bb:(p + 1) * bb], expected)
    assert np.allclose(feats.matrix[0, 0::bb], 0.0)
    assert np.allclose(feats.matrix[1, 0::bb], 2.0)
