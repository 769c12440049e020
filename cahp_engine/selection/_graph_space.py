"""The graph space: a seeded 2-D t-SNE embedding of the heads' separation features.

References
----------
Paper Section III-C (last paragraph) and Fig. 1 (ii).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sklearn.manifold import TSNE
from threadpoolctl import threadpool_limits

#: Features are rounded to this many decimals before t-SNE (JM values lie in [0, 2]), so that
#: last-bit differences between BLAS builds or thread counts in earlier stages do not move the
#: embedding.
FEATURE_DECIMALS = 6


@dataclass(frozen=True)
class GraphSpace:
    """Heads embedded in 2-D.

    Attributes
    ----------
    points : ndarray of shape (N, 2), float64
        Row ``n = l * H + h``.
    perplexity : float
    kl_divergence : float
        t-SNE's final objective value.
    """

    points: np.ndarray
    perplexity: float
    kl_divergence: float


#: The perplexity of the public CAHP implementation (scikit-learn's own default is 30).
DEFAULT_PERPLEXITY = 10.0


def default_perplexity(n_points: int) -> float:
    """``min(10, (N - 1) / 3)``: the public implementation's 10 where there are enough heads, and a
    value that keeps about three neighbourhoods' worth of points for small models (t-SNE requires
    perplexity < N)."""
    return float(min(DEFAULT_PERPLEXITY, max(1.0, (n_points - 1) / 3.0)))


def embed_heads(features: np.ndarray, *, seed: int, perplexity: float | None = None) -> GraphSpace:
    """Embed the heads' feature rows in 2-D with t-SNE.

    Parameters
    ----------
    features : ndarray of shape (N, D)
    seed : int
        ``random_state`` of t-SNE.
    perplexity : float, optional
        Defaults to :func:`default_perplexity`; must be below N.

    Returns
    -------
    GraphSpace

    Notes
    -----
    The exact (O(N^2)) gradient is used: for the few hundred heads of an encoder it takes about
    a second, and unlike Barnes-Hut its result does not depend on the number of OpenMP threads.
    BLAS and OpenMP are limited to one thread for the call so that the same seed gives the same
    embedding on any machine size.
    """
    n = features.shape[0]
    perp = default_perplexity(n) if perplexity is None else float(perplexity)
    if not 0 < perp < n:
        raise ValueError(f"`perplexity` must be in (0, {n}) for {n} heads, got {perp}")
    x = np.round(np.asarray(features, dtype=np.float64), FEATURE_DECIMALS)
    tsne = TSNE(
        n_components=2,
        perplexity=perp,
        # PCA initialisation needs some spread; identical rows (no head separates anything) fall
        # back to a seeded random start instead of a division by zero.
        init="pca" if np.ptp(x, axis=0).max(initial=0.0) > 0 else "random",
        learning_rate="auto",
        method="exact",
        random_state=seed,
    )
    with threadpool_limits(limits=1):
        points = tsne.fit_transform(x)
    return GraphSpace(points=np.asarray(points, dtype=np.float64), perplexity=perp,
                      kl_divergence=float(tsne.kl_divergence_))
