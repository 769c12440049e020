"""CAHP's head count in each layer, filled with that layer's most salient heads.

CAHP decides how many heads each layer keeps (one representative per cluster, plus layer safety); this
strategy keeps exactly those counts but, within each layer, the heads of highest salience rather than
the clusters' representatives. On SST-5 it gave a stronger model than CAHP before any recovery (the
quality-causes study, docs/performance.md), which is what a retraining-free recovery (layer-wise
reconstruction) keeps; after full fine-tuning the two land level.

References
----------
Paper Algorithm 1 lines 10-11 and Section III-D (CAHP's representatives and layer safety, whose
per-layer counts this keeps).
"""

from __future__ import annotations

import numpy as np

from cahp_engine.selection._analysis import HeadAnalysis
from cahp_engine.selection._choice import Selection, select_representatives

NAME = "cahp-layer-salience"


def choose(analysis: HeadAnalysis, k: int, *, count: int, seed: int) -> Selection:
    """CAHP's per-layer counts at ``k`` clusters, the most salient heads of each layer (ties: lower index).

    ``count`` and ``seed`` are not used: the head count is CAHP's at ``k``.
    """
    cahp = select_representatives(analysis.labels(k), analysis.salience)
    return salience_within_layers(np.asarray(analysis.salience, dtype=np.float64), cahp.kept_mask.sum(axis=1))


def salience_within_layers(salience: np.ndarray, per_layer: np.ndarray) -> Selection:
    """Keep the ``per_layer[l]`` most salient heads of each layer ``l``.

    Parameters
    ----------
    salience : ndarray of shape (L, H)
    per_layer : ndarray of shape (L,), int
        Heads to keep in each layer, 0 <= per_layer[l] <= H.
    """
    mask = np.zeros(salience.shape, dtype=bool)
    for layer, count in enumerate(np.asarray(per_layer, dtype=np.int64)):
        order = np.argsort(-salience[layer], kind="stable")[: int(count)]
        mask[layer, order] = True
    heads = tuple((int(layer), int(head)) for layer, head in zip(*np.nonzero(mask), strict=True))
    return Selection(kept_mask=mask, representatives=heads, layer_safety_added=(), strategy=NAME)
