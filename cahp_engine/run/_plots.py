"""Figures of a pruning run, written as PNG files: the MSS curve with its knees, and the head map.

Every figure is a :class:`matplotlib.figure.Figure` drawn on its own Agg canvas, never through
``pyplot``: a worker or a notebook that imports the engine keeps whatever backend it chose, and no
figure lingers in pyplot's global registry.

References
----------
Paper Section III-D (MSS curve, Kneedle knee k*, representatives, layer safety) and Section IV-B.2
(knees of polynomial degrees 2..6).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import MaxNLocator, PercentFormatter

from cahp_engine.errors import InvalidInputError
from cahp_engine.results import BudgetRecord

Head = tuple[int, int]

_DPI = 110
_KEPT, _PRUNED = "#2b83ba", "#d9d9d9"
_REPRESENTATIVE, _SAFETY, _CHOSEN = "black", "#d7191c", "#d7191c"
# tab20, tab20b and tab20c: 60 distinguishable colours for cluster ids, repeated beyond that.
_CLUSTER_COLOURS = np.concatenate([colormaps[name](np.arange(20))[:, :3] for name in ("tab20", "tab20b", "tab20c")])
_MAX_LABELLED_CELLS = 400  # cluster ids are written into the cells up to this many heads


def _save(fig: Figure, path: str | os.PathLike[str]) -> None:
    FigureCanvasAgg(fig)  # attaches itself as fig.canvas
    fig.savefig(os.fspath(path), format="png", dpi=_DPI)


# --- the MSS curve ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MssPlot:
    """What :func:`plot_mss_curve` draws: MSS(k) and the knee of each polynomial degree.

    Attributes
    ----------
    ks : sequence of int, shape (K,)
        Cluster counts swept.
    mss : sequence of float, shape (K,)
        Mean simplified silhouette at each k.
    knees_by_degree : mapping of int to int or None
        Knee k of each polynomial degree; None where no knee was found (the legend says so).
    chosen_k : int
        The k* the run used, drawn as a bold line with a star on the curve.
    chosen_degree : int, optional
        Degree that produced ``chosen_k``, named in the legend.
    title : str, optional
        Figure title; the default names the curve.
    """

    ks: Sequence[int]
    mss: Sequence[float]
    knees_by_degree: Mapping[int, int | None]
    chosen_k: int
    chosen_degree: int | None = None
    title: str | None = None


def plot_mss_curve(curve: MssPlot, path: str | os.PathLike[str]) -> None:
    """Plot MSS(k) with a dashed vertical line at the knee of each polynomial degree.

    Parameters
    ----------
    curve : MssPlot
    path : str or path
        PNG file to write; its folder must exist.

    References
    ----------
    Paper Section III-D and IV-B.2.
    """
    ks, mss, knees_by_degree, chosen_k = curve.ks, curve.mss, curve.knees_by_degree, curve.chosen_k
    chosen_degree, title = curve.chosen_degree, curve.title
    x = np.asarray(ks, dtype=np.float64)
    y = np.asarray(mss, dtype=np.float64)
    if x.ndim != 1 or x.shape != y.shape or x.size == 0:
        raise InvalidInputError(f"`ks` and `mss` must be 1-D of one non-zero length, got {x.shape} and {y.shape}")

    fig = Figure(figsize=(7.5, 4.6), layout="constrained")
    ax = fig.add_subplot()
    ax.plot(x, y, color="#404040", marker="o", ms=2.5 if x.size > 60 else 4, lw=1.2, label="MSS(k)", zorder=2)

    degrees = sorted(knees_by_degree)
    cmap = colormaps["viridis"]
    for i, degree in enumerate(degrees):
        knee = knees_by_degree[degree]
        if knee is None:
            # An empty handle keeps the degree in the legend, so a missing knee is visible.
            ax.plot([], [], ls="none", label=f"d={degree}: no knee")
            continue
        colour = cmap(0.85 * i / max(len(degrees) - 1, 1))
        ax.axvline(knee, color=colour, ls="--", lw=1.2, label=f"d={degree}: k={knee}", zorder=1)

    chosen = f"chosen k*={chosen_k}" + (f" (d={chosen_degree})" if chosen_degree is not None else "")
    ax.axvline(chosen_k, color=_CHOSEN, lw=2.4, alpha=0.8, label=chosen, zorder=1.5)
    ax.plot([chosen_k], [np.interp(chosen_k, x, y)], marker="*", ms=16, color=_CHOSEN, mec="white", zorder=3)

    ax.set_xlabel("k (number of clusters = heads kept)")
    ax.set_ylabel("mean simplified silhouette (MSS)")
    ax.set_title(title if title is not None else "MSS curve and the knee of each polynomial degree")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    low, high = ax.get_xlim()
    if high - low < 2:  # a curve of one or two points: leave room for whole-number ticks
        ax.set_xlim(low - 1, high + 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8, framealpha=0.9)
    _save(fig, path)


# --- the head map -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HeadMap:
    """What :func:`plot_head_map` draws over the layer x head grid.

    Attributes
    ----------
    kept : ndarray of shape (L, H), bool
    salience : ndarray of shape (L, H)
    cluster : ndarray of shape (L, H) or (L * H,), int
        Cluster id of each head; a flat array is read row-major (head ``n = l * H + h``).
    representatives, layer_safety_added : iterables of (layer, head)
    kept_frequency : ndarray of shape (L, H), optional
        Share (0..1) of the leave-one-shard-out selections that kept each head.
    stability_title : str, optional
        Title of that panel (default: "kept when a shard is left out").
    consensus_frequency : ndarray of shape (L, H), optional
        Share (0..1) of the K + 1 single-run choices a consensus strategy combined that kept each head.
    consensus_title : str, optional
        Title of that panel (default: "kept by the runs of the consensus").
    """

    kept: np.ndarray
    salience: np.ndarray
    cluster: np.ndarray
    representatives: Iterable[Head] = ()
    layer_safety_added: Iterable[Head] = ()
    kept_frequency: np.ndarray | None = None
    stability_title: str | None = None
    consensus_frequency: np.ndarray | None = None
    consensus_title: str | None = None


def plot_head_map(head_map: HeadMap, path: str | os.PathLike[str]) -> None:
    """Three panels over the layer x head grid: kept or pruned, salience, and cluster id; then, when
    given, how often each head was kept when one shard of the samples was left out, and how often
    CAHP's choices on the K + 1 analyses a consensus combined kept it.

    Representatives are outlined in black and heads kept by the layer-safety rule in red, on every
    panel. Cluster ids get categorical colours and are written into the cells when the grid has at
    most 400 heads.

    Parameters
    ----------
    head_map : HeadMap
        The grid's heads and what to show of them.
    path : str or path
        PNG file to write; its folder must exist.

    References
    ----------
    Paper Section III-D (representatives and layer safety).
    """
    mask = _kept_grid(head_map.kept)
    shape = mask.shape
    heat = np.asarray(head_map.salience, dtype=np.float64)
    ids = np.asarray(head_map.cluster)
    if heat.shape != shape:
        raise InvalidInputError(f"`salience` must have the shape of `kept` {shape}, got {heat.shape}")
    if ids.size != mask.size or ids.ndim not in (1, 2) or (ids.ndim == 2 and ids.shape != shape):
        raise InvalidInputError(f"`cluster` must have shape {shape} or ({mask.size},), got {ids.shape}")
    ids = ids.reshape(shape)
    reps = _heads(head_map.representatives, shape, "representatives")
    safety = _heads(head_map.layer_safety_added, shape, "layer_safety_added")
    shares = []
    for name, given, title in (("kept_frequency", head_map.kept_frequency,
                                head_map.stability_title or "kept when a shard is left out"),
                               ("consensus_frequency", head_map.consensus_frequency,
                                head_map.consensus_title or "kept by the runs of the consensus")):
        if given is None:
            continue
        frequency = np.asarray(given, dtype=np.float64)
        if frequency.shape != shape:
            raise InvalidInputError(f"`{name}` must have the shape of `kept` {shape}, got {frequency.shape}")
        shares.append((frequency, title))

    layers, heads = shape
    panels = 3 + len(shares)
    # Square cells of at least 0.34 inch, and panels at least 2.2 inches wide so the titles fit.
    cell = max(0.34, 2.2 / heads)
    fig = Figure(figsize=(panels * heads * cell + 2.6 + 1.2 * (panels - 3), layers * cell + 1.9),
                 layout="constrained")
    axes = list(fig.subplots(1, panels))
    ax_kept, ax_heat, ax_ids = axes[:3]

    ax_kept.imshow(mask.astype(int), cmap=ListedColormap([_PRUNED, _KEPT]), vmin=0, vmax=1)
    ax_kept.set_title(f"kept {int(mask.sum())} of {mask.size} heads ({mask.mean():.0%})")

    image = ax_heat.imshow(heat, cmap="magma")
    # An inset colour bar follows the image's own height; fig.colorbar(ax=...) would span the whole
    # subplot box, which is taller or wider than an aspect-locked image.
    fig.colorbar(image, cax=ax_heat.inset_axes((1.04, 0.0, 0.05, 1.0)), label="salience")
    ax_heat.set_title("salience")

    rank = np.unique(ids, return_inverse=True)[1].reshape(shape)
    colours = _CLUSTER_COLOURS[rank % len(_CLUSTER_COLOURS)]
    ax_ids.imshow(colours)
    ax_ids.set_title(f"cluster ({len(np.unique(ids))} clusters)")
    if mask.size <= _MAX_LABELLED_CELLS:
        size = 7 if max(len(str(v)) for v in ids.ravel()) <= 2 else 5.5
        for (layer, head), value in np.ndenumerate(ids):
            dark = float(np.dot(colours[layer, head], (0.299, 0.587, 0.114))) < 0.5
            ax_ids.text(
                head,
                layer,
                str(value),
                ha="center",
                va="center",
                fontsize=size,
                color="white" if dark else "black",
            )

    for ax_freq, (frequency, title) in zip(axes[3:], shares, strict=True):
        shown = ax_freq.imshow(frequency, cmap="Blues", vmin=0.0, vmax=1.0)
        fig.colorbar(shown, cax=ax_freq.inset_axes((1.04, 0.0, 0.05, 1.0)), label="share of selections")
        ax_freq.set_title(title)
    for ax in axes:
        _grid_axes(ax, shape)
        _outline(ax, reps, _REPRESENTATIVE)
        _outline(ax, safety, _SAFETY)

    legend = [
        Patch(color=_KEPT, label="kept"),
        Patch(color=_PRUNED, label="pruned"),
        _frame_handle(_REPRESENTATIVE, f"representative ({len(reps)})"),
        _frame_handle(_SAFETY, f"kept by layer safety ({len(safety)})"),
    ]
    fig.legend(handles=legend, loc="outside lower center", ncols=4, fontsize=8, frameon=False)
    _save(fig, path)


def _kept_grid(kept: np.ndarray) -> np.ndarray:
    mask = np.asarray(kept)
    if mask.ndim != 2 or mask.size == 0:
        raise InvalidInputError(f"`kept` must be a non-empty (layers, heads) array, got shape {mask.shape}")
    if mask.dtype != bool and not np.isin(mask, (0, 1)).all():
        raise InvalidInputError("`kept` must hold booleans (or 0/1) saying which heads are kept")
    return mask.astype(bool)


def _heads(heads: Iterable[Head], shape: tuple[int, ...], name: str) -> list[Head]:
    out = [(int(layer), int(head)) for layer, head in heads]
    outside = [h for h in out if not (0 <= h[0] < shape[0] and 0 <= h[1] < shape[1])]
    if outside:
        raise InvalidInputError(f"`{name}` holds heads {outside[:5]} outside the {shape[0]} x {shape[1]} grid")
    return out


def _grid_axes(ax: Axes, shape: tuple[int, ...]) -> None:
    layers, heads = shape
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(_index_ticks(heads, 16))
    ax.set_yticks(_index_ticks(layers, 24))
    # Thin white lines between cells make single heads easy to count.
    ax.set_xticks(np.arange(-0.5, heads, 1.0), minor=True)
    ax.set_yticks(np.arange(-0.5, layers, 1.0), minor=True)
    ax.grid(which="minor", color="white", lw=0.6)
    ax.tick_params(which="minor", length=0)


def _frame_handle(colour: str, label: str) -> Line2D:
    return Line2D([], [], color=colour, marker="s", mfc="none", ls="none", ms=9, mew=1.8, label=label)


def _index_ticks(n: int, most: int) -> np.ndarray:
    return np.arange(0, n, -(-n // most))


def _outline(ax: Axes, heads: Sequence[Head], colour: str) -> None:
    # A white halo under the coloured frame keeps it visible on dark and light cells alike.
    for layer, head in heads:
        for edge, width in (("white", 3.4), (colour, 1.7)):
            ax.add_patch(Rectangle((head - 0.42, layer - 0.42), 0.84, 0.84, fill=False, ec=edge, lw=width))


# --- retention per layer ------------------------------------------------------------------------------


def plot_layer_retention(kept: np.ndarray, path: str | os.PathLike[str]) -> None:
    """Bar chart of the share of heads kept in each layer, with the overall share as a dashed line.

    Parameters
    ----------
    kept : ndarray of shape (L, H), bool
    path : str or path
        PNG file to write; its folder must exist.

    References
    ----------
    Paper Section IV-C (where in depth the kept heads lie).
    """
    mask = _kept_grid(kept)
    layers, heads = mask.shape
    share = mask.mean(axis=1)
    fig = Figure(figsize=(max(4.5, 0.42 * layers + 2.0), 3.8), layout="constrained")
    ax = fig.add_subplot()
    bars = ax.bar(np.arange(layers), share, color=_KEPT, width=0.75, zorder=2)
    counts = mask.sum(axis=1)
    # Drawn under the bars, and the count labels on a white box, so the line never hides a count.
    ax.axhline(mask.mean(), color=_SAFETY, ls="--", lw=1.2, zorder=1)
    ax.bar_label(
        bars,
        labels=[f"{c}/{heads}" for c in counts],
        fontsize=7 if layers <= 24 else 5.5,
        padding=2,
        bbox={"fc": "white", "ec": "none", "pad": 0.6},
    )
    ax.set_ylim(0, 1.12)
    ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
    ax.set_xticks(_index_ticks(layers, 24))
    ax.set_xlim(-0.6, layers - 0.4)
    ax.set_xlabel("layer")
    ax.set_ylabel("heads kept")
    ax.set_title(f"share of heads kept per layer\n(dashed line: all layers, {mask.mean():.0%})", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    _save(fig, path)


def plot_layer_units(heads: Sequence[int], neurons: Sequence[int], *, heads_total: int, neurons_total: int,
                     path: str | os.PathLike[str]) -> None:
    """Bars of the share of heads and of feed-forward neurons each layer kept (a target's allocation).

    Parameters
    ----------
    heads, neurons : sequence of L ints
        Kept per layer; 0 is a skipped sub-layer.
    heads_total, neurons_total : int
        Of one dense layer.
    path : str or path
        PNG file to write; its folder must exist.
    """
    layers = len(heads)
    share_h = np.asarray(heads, dtype=float) / heads_total
    share_n = np.asarray(neurons, dtype=float) / neurons_total
    fig = Figure(figsize=(max(4.5, 0.6 * layers + 2.0), 3.8), layout="constrained")
    ax = fig.add_subplot()
    x = np.arange(layers)
    small = 7 if layers <= 16 else 5.5
    for offset, share, kept, color, label in ((-0.2, share_h, heads, _KEPT, "attention heads"),
                                              (0.2, share_n, neurons, "#fdae61", "feed-forward neurons")):
        bars = ax.bar(x + offset, share, width=0.4, color=color, label=label, zorder=2)
        ax.bar_label(bars, labels=[str(k) for k in kept], fontsize=small, padding=2)
    ax.set_ylim(0, 1.3)  # room for the legend above the bars
    ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
    ax.set_xticks(_index_ticks(layers, 24))
    ax.set_xlim(-0.6, layers - 0.4)
    ax.set_xlabel("layer")
    ax.set_ylabel("kept")
    ax.set_title(f"heads (of {heads_total}) and feed-forward neurons (of {neurons_total}) kept per layer",
                 fontsize=10)
    ax.legend(fontsize=8, loc="upper center", ncols=2)
    ax.grid(axis="y", alpha=0.3)
    _save(fig, path)


def plot_budget(budget: BudgetRecord, *, total_heads: int, path: str | os.PathLike[str]) -> None:
    """The accuracy budget's candidates: best validation score against heads kept, one marker per strategy.

    Per candidate, in the order tried: its heads kept, the validation score (0-1) before recovery and
    at its best evaluation, with the 95 % interval of that best score drawn as an error bar; the
    budget's threshold and the dense model's score as lines; the chosen candidate (if any) as a star.

    Parameters
    ----------
    budget : BudgetRecord
        With at least one candidate.
    total_heads : int
    path : str or path
        PNG file to write; its folder must exist.
    """
    metric, cands = budget.metric, budget.candidates
    if not cands:
        raise InvalidInputError("the budget plot needs at least one candidate")
    threshold, dense = budget.threshold, budget.dense_validation
    heads_kept = [c.heads_kept for c in cands]
    strategies = [c.strategy for c in cands]
    before = [c.accuracy_before if metric == "accuracy" else c.macro_f1_before for c in cands]
    best = [c.accuracy_best if metric == "accuracy" else c.macro_f1_best for c in cands]
    # The drop's interval (points) turned into one of the score: score = dense - drop / 100.
    interval = [(dense - c.drop.high / 100.0, dense - c.drop.low / 100.0) for c in cands]
    chosen = next((i for i, c in enumerate(cands) if c.chosen), None)
    n = len(cands)
    fig = Figure(figsize=(6.4, 4.0), layout="constrained")
    ax = fig.add_subplot()
    x = np.asarray(heads_kept, dtype=float)
    ax.plot(x, np.asarray(before), "o", color=_PRUNED, markeredgecolor="grey", label="before recovery", zorder=2)
    markers = "osD^v<>p"
    for i, name in enumerate(dict.fromkeys(strategies)):
        rows = [j for j in range(n) if strategies[j] == name]
        # A percentile interval need not contain the point itself: a bar never points the wrong way.
        lo = np.asarray([max(0.0, best[j] - interval[j][0]) for j in rows])
        hi = np.asarray([max(0.0, interval[j][1] - best[j]) for j in rows])
        # Neighbouring strategies side by side at one head count.
        ax.errorbar(x[rows] + 0.25 * i, np.asarray(best)[rows], yerr=np.vstack([lo, hi]), fmt=markers[i % 8],
                    color=_CLUSTER_COLOURS[i % len(_CLUSTER_COLOURS)], capsize=2, lw=0.8,
                    label=f"{name}: best after recovery (95 % interval)", zorder=3)
    ax.axhline(dense, color="black", ls="--", lw=1, label=f"dense ({dense:.1%})", zorder=1)
    ax.axhline(threshold, color=_SAFETY, ls="-.", lw=1.2, label=f"budget threshold ({threshold:.1%})", zorder=1)
    if chosen is not None:
        ax.plot([x[chosen]], [best[chosen]], marker="*", ms=16, color=_CHOSEN, ls="none",
                label=f"chosen: {heads_kept[chosen]} heads ({strategies[chosen]})", zorder=4)
    ax.set_xlim(0, total_heads)
    ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
    ax.set_xlabel(f"heads kept (of {total_heads})")
    ax.set_ylabel(f"validation {metric.replace('_', '-')}")
    verdict = "no candidate within the budget" if chosen is None else "the fewest heads within the budget"
    ax.set_title(f"accuracy budget: every candidate tried\n({verdict})", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    _save(fig, path)
