import numpy as np
import pytest
from scipy.spatial.distance import cdist

from cahp_engine.selection import cluster, mean_simplified_silhouette, mss_sweep


def brute_force_mss(points, medoids):
    """Paper Eq. 3-5 written out point by point."""
    scores = []
    for i, x in enumerate(points):
        if i in set(medoids.tolist()):
            continue
        d = [float(np.linalg.norm(x - points[m])) for m in medoids]
        own = int(np.argmin(d))
        a = d[own]
        b = sum(d[j] for j in range(len(d)) if j != own) / (len(d) - 1)
        scores.append(1 - a / b)
    return float(np.mean(scores))


def test_mss_matches_a_direct_computation():
    rng = np.random.default_rng(0)
    points = rng.normal(size=(40, 2))
    dist = cdist(points, points)
    for k in (2, 3, 7, 20, 39):
        c = cluster(dist, k, seed=1)
        assert c.mss == pytest.approx(brute_force_mss(points, c.medoids), rel=1e-12)
        assert mean_simplified_silhouette(dist, c.medoids, c.labels) == c.mss


def test_sweep_covers_every_k_and_finds_well_separated_blobs():
    rng = np.random.default_rng(2)
    centres = np.array([[0, 0], [10, 0], [0, 10], [10, 10]], dtype=float)
    points = np.concatenate([c + rng.normal(scale=0.3, size=(8, 2)) for c in centres])
    curve = mss_sweep(points, seed=3)
    assert curve.ks.tolist() == list(range(2, 32))
    assert len(curve.clusterings) == 30
    c4 = curve.at(4)
    # Four tight, far blobs: the 4-medoid partition is the blobs, one medoid in each.
    assert len({tuple(np.round(centres[np.argmin(cdist(points[[m]], centres))])) for m in c4.medoids}) == 4
    assert curve.mss[curve.ks.tolist().index(4)] > 0.9
    with pytest.raises(KeyError):
        curve.at(40)


def test_sweep_is_deterministic_for_a_seed():
    points = np.random.default_rng(5).normal(size=(30, 2))
    a, b = mss_sweep(points, seed=7), mss_sweep(points, seed=7)
    np.testing.assert_array_equal(a.mss, b.mss)


def test_sweep_rejects_impossible_ks():
    with pytest.raises(ValueError, match="2..9"):
        mss_sweep(np.zeros((10, 2)), ks=[1, 2], seed=0)
