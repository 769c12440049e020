import numpy as np

from cahp_engine.selection import chord_knee, find_knee, knees_by_degree


def saturating_curve(ks, knee_at):
    """Rises linearly until ``knee_at``, then is flat: the knee is at ``knee_at``."""
    return np.minimum(ks, knee_at) / knee_at


def test_knee_of_a_curve_with_a_known_knee():
    ks = np.arange(2, 72)
    mss = saturating_curve(ks, 20)
    for degree in (4, 5, 6):
        knee = find_knee(ks, mss, degree=degree)
        assert knee.found and knee.warning is None
        assert abs(knee.k - 20) <= 4, (degree, knee.k)


def test_higher_degree_follows_a_smooth_curve_no_later():
    ks = np.arange(2, 200)
    mss = 1 - np.exp(-ks / 15)
    knees = knees_by_degree(ks, mss, [2, 3, 4, 5, 6])
    assert set(knees) == {2, 3, 4, 5, 6}
    assert all(k.found for k in knees.values())
    assert knees[6].k <= knees[2].k


def test_no_knee_falls_back_and_warns_instead_of_crashing():
    ks = np.arange(2, 30)
    for mss in (np.full(len(ks), 0.5), ks / 30.0):
        knee = find_knee(ks, mss, degree=2)
        assert not knee.found
        assert knee.k in ks
        assert "no knee" in knee.warning
    assert find_knee([2, 3], [0.1, 0.2], degree=2).k in (2, 3)
    # A convex curve has no concave knee; whatever kneed answers, a k of the curve comes back.
    assert find_knee(ks, np.exp(ks / 5.0), degree=3).k in ks


def test_chord_knee_is_the_farthest_point_above_the_chord():
    ks = np.arange(0, 11)
    mss = np.array([0, 5, 8, 9, 9.5, 9.6, 9.7, 9.8, 9.9, 9.95, 10], dtype=float)
    assert chord_knee(ks, mss) == 2
