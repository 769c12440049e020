"""The cheap stages of the analysis, from signature statistics to knees: separation -> graph space ->
MSS sweep -> knees.

They see only the N heads, never the samples, so they can be rerun on other statistics at little
cost: the stopping rule of :mod:`cahp_engine.selection._convergence` reruns them at each rung of its ladder and the
stability measure once per left-out shard.

References
----------
Paper Algorithm 1, lines 3-9 (Section III-C, Eq. 1-2; Section III-D, Eq. 3-5).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from cahp_engine.progress import Monitor
from cahp_engine.selection._graph_space import GraphSpace, default_perplexity, embed_heads
from cahp_engine.selection._knee import Knee, knees_by_degree
from cahp_engine.selection._separation import separation_features
from cahp_engine.selection._signatures import Signatures
from cahp_engine.selection._sweep import MssCurve, mss_sweep


@dataclass(frozen=True)
class HeadStructure:
    """The heads' graph space, MSS curve and knees, from one set of signature statistics.

    Attributes
    ----------
    graph_space : GraphSpace
        t-SNE coordinates, row ``l * H + h``.
    curve : MssCurve
        FasterPAM partition and MSS for k = 2..N-1.
    knees : dict of int to Knee
        The knee of each requested polynomial degree.
    """

    graph_space: GraphSpace
    curve: MssCurve
    knees: dict[int, Knee]


def head_structure(
    signatures: Signatures,
    *,
    var_floor: float,
    perplexity: float | None,
    seed: int,
    degrees: Sequence[int],
    monitor: Monitor | None = None,
) -> HeadStructure:
    """Separation features, graph space, MSS sweep and knees of one set of signatures.

    Parameters
    ----------
    signatures : Signatures
        Means and variances of shape (C, N, B * B).
    var_floor : float
        Floor on the class variances before Eq. 1.
    perplexity : float or None
        t-SNE perplexity; None takes :func:`~cahp_engine.selection.default_perplexity` of N.
    seed : int
        Seeds t-SNE and FasterPAM.
    degrees : sequence of int
        Polynomial degrees whose knees are located.
    monitor : Monitor, optional
        When given, each stage is timed and reported under its name (``separation``,
        ``graph_space``, ``sweep``, ``knee``); otherwise the stages run silently.

    Returns
    -------
    HeadStructure
    """

    @contextlib.contextmanager
    def stage(name: str) -> Iterator[None]:
        if monitor is None:
            yield
        else:
            with monitor.stage(name):
                yield

    with stage("separation"):
        features = separation_features(signatures, var_floor=var_floor)
    n = features.matrix.shape[0]
    with stage("graph_space"):
        graph = embed_heads(features.matrix, seed=seed, perplexity=perplexity or default_perplexity(n))
    with stage("sweep"):
        on_k: Callable[[int], None] | None = None
        if monitor is not None:
            tick = monitor.counter("sweep", n - 2)
            on_k = lambda _k: tick(1)  # noqa: E731
        curve = mss_sweep(graph.points, seed=seed, on_k=on_k)
    with stage("knee"):
        knees = knees_by_degree(curve.ks, curve.mss, sorted(set(degrees)))
    return HeadStructure(graph_space=graph, curve=curve, knees=knees)
