"""Why CAHP's heads recover worse or better than salience top-k: one cause changed at a time.

Runs on the quality study's cache (the same dense all-MiniLM-L6-v2, the same recovery recipe, the
same test split), so every figure here sits beside the CAHP / salience top-k / random cells of
``python -m studies quality --paper-protocol`` for the same seed and degree. Each variant changes one
thing against CAHP with the engine's defaults:

- ``cahp_old_perplexity``: the earlier t-SNE perplexity rule, min(30, (N - 1) / 3) (23.7 for 72
  heads) instead of min(10, (N - 1) / 3). Its knee, hence its head count, may differ.
- ``cahp_full_data``: the selection from every training row (signatures and salience) instead of the
  stopping rules (does the accuracy after recovery stay within the seeds' spread?).
- ``salience_in_cahp_layers``: CAHP's number of heads in each layer, filled with that layer's most
  salient heads. If it recovers like salience top-k, CAHP's layer distribution is not what costs it;
  if like CAHP, it is.
- ``cluster_salience``: CAHP's knee and clusters, but the head count shared among the clusters by their
  salience mass (D'Hondt: a cluster holding many salient heads gets several seats, one whose mass earns
  no seat gets none), the most salient members first. Tests "one representative per cluster".

The two CAHP variants are the registry's ``cahp`` strategy (:func:`cahp_engine.selection.choose`) on an
analysis made with another configuration. The other two are research variants written here, not
strategies of the registry: they test a hypothesis about CAHP's rule and are not offered to users.
Measured on SST-5 (docs/performance.md), neither earned a place: after recovery both land level with
CAHP; before recovery ``salience_in_cahp_layers`` gives the strongest model, but cahp's deliverable is
the recovered model, and ``cluster_salience`` collapses like salience top-k.

Every variant is recovered with cross-entropy (the paper's loss) so that it compares with the ``ce``
cells. Finished cells go to ``causes-<recovery>.json`` in the grid's cache at once (resumable on the
same checkout; the cache is not tracked by git, see ``python -m studies``).

Run: ``python -m studies quality-causes [--seeds 42,43,44] [--degrees 6] [--variants ...] [--report-only]``
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from cahp_engine._torch import resolve_device
from cahp_engine.config import REPORTED_DEGREES, PruningConfig
from cahp_engine.selection import HeadAnalysis, analyze_heads, choose
from studies import grid_study, quality

VARIANTS = ("cahp_old_perplexity", "cahp_full_data", "salience_in_cahp_layers", "cluster_salience")
LABELS = {
    "cahp_old_perplexity": "CAHP, perplexity min(30, (N-1)/3)",
    "cahp_full_data": "CAHP, every training row",
    "salience_in_cahp_layers": "Salience top-k within CAHP's layer counts",
    "cluster_salience": "Cluster salience (D'Hondt seats)",
}


def _heads(mask: np.ndarray) -> list[list[int]]:
    return [[int(layer), int(head)] for layer, head in zip(*np.nonzero(mask), strict=True)]


def _per_layer(heads: list[list[int]], n_layers: int) -> list[int]:
    counts = [0] * n_layers
    for layer, _head in heads:
        counts[layer] += 1
    return counts


def salience_in_layers(salience: np.ndarray, per_layer: np.ndarray) -> np.ndarray:
    """Keep ``per_layer[l]`` heads of layer l, the most salient of that layer (ties: lower index).

    ``salience_in_cahp_layers``: a research variant, not a registry strategy (the module docstring says why).
    """
    mask = np.zeros(salience.shape, dtype=bool)
    for layer, count in enumerate(per_layer):
        order = np.argsort(-salience[layer], kind="stable")[: int(count)]
        mask[layer, order] = True
    return mask


def cluster_salience(labels: np.ndarray, salience: np.ndarray, count: int) -> np.ndarray:
    """Share ``count`` seats among the clusters by D'Hondt on their salience mass; fill each by salience.

    ``cluster_salience``: a research variant, not a registry strategy (the module docstring says why).

    Parameters
    ----------
    labels : ndarray of shape (N,)
        Cluster of head ``l * H + h``.
    salience : ndarray of shape (L, H)
        Normalised salience in [0, 1].
    count : int
        Heads to keep.

    Returns
    -------
    ndarray of shape (L, H), bool
    """
    flat = salience.reshape(-1)
    members = {int(c): np.flatnonzero(labels == c)[np.argsort(-flat[labels == c], kind="stable")]
               for c in np.unique(labels)}
    mass = {c: float(flat[m].sum()) for c, m in members.items()}
    seats = dict.fromkeys(members, 0)
    for _ in range(count):
        open_ = [c for c in members if seats[c] < len(members[c])]
        best = max(open_, key=lambda c: (mass[c] / (seats[c] + 1), -c))
        seats[best] += 1
    mask = np.zeros(flat.shape, dtype=bool)
    for c, n in seats.items():
        mask[members[c][:n]] = True
    return mask.reshape(salience.shape)


def analysis_for(dense: Any, train: Any, protocol: quality.Protocol, seed: int, **overrides: Any) -> HeadAnalysis:
    """The analysis ``python -m studies quality`` made for ``seed``, with ``overrides`` of its config."""
    degrees = tuple(sorted(set(REPORTED_DEGREES) | set(protocol.degrees)))
    config = PruningConfig(poly_degree=protocol.degrees[0], resolution=protocol.resolution, seed=seed,
                           batch_size=protocol.batch_size, reported_degrees=degrees, **overrides)
    return analyze_heads(dense, train, config)


def variant_heads(name: str, analyses: dict[str, HeadAnalysis], degree: int, seed: int) -> dict[str, Any]:
    """The heads ``name`` keeps at ``degree``, with its k and count."""
    base = analyses["default"]
    knee = base.knees[degree].k
    cahp = choose(base, knee, "cahp", seed=seed)
    if name in ("cahp_old_perplexity", "cahp_full_data"):
        other = analyses[name]
        k = other.knees[degree].k
        chosen = choose(other, k, "cahp", seed=seed)
        return {"k": k, "heads": _heads(chosen.kept_mask), "heads_kept": chosen.num_kept}
    if name == "salience_in_cahp_layers":
        mask = salience_in_layers(base.salience, cahp.kept_mask.sum(axis=1))
    elif name == "cluster_salience":
        mask = cluster_salience(base.labels(knee), base.salience, cahp.num_kept)
    else:
        raise ValueError(f"unknown variant {name!r}; choose from {', '.join(VARIANTS)}")
    return {"k": knee, "heads": _heads(mask), "heads_kept": int(mask.sum())}


def run(protocol: quality.Protocol, variants: tuple[str, ...], *, base: str, cache: Path, data_dir: Path,
        compute: bool, say: Any) -> dict[str, Any]:
    """Recover every (seed, degree, variant) cell not yet in the cache; return the cells with the grid's
    CAHP / salience top-k / random cross-entropy cells of the same seeds and degrees beside them."""
    cells_path = cache / f"causes-{protocol.cells_file()}"
    cells: dict[str, Any] = quality._read_json(cells_path) or {}
    todo = [(s, d, v) for s in protocol.seeds for d in protocol.degrees for v in variants]
    pending = [t for t in todo if f"seed={t[0]}/degree={t[1]}/variant={t[2]}" not in cells]
    if compute and pending:
        device = resolve_device("cpu")
        dense, tokenizer, record = quality.dense_model(base, data_dir, cache, protocol, device, say)
        train, test = quality.load_data(data_dir, tokenizer, protocol)
        for seed in sorted({s for s, _, _ in pending}):
            wanted = {v for s, _, v in pending if s == seed}
            t = time.perf_counter()
            analyses = {"default": analysis_for(dense, train, protocol, seed)}
            if "cahp_old_perplexity" in wanted:
                n = analyses["default"].salience.size
                analyses["cahp_old_perplexity"] = analysis_for(dense, train, protocol, seed,
                                                               perplexity=min(30.0, (n - 1) / 3))
            if "cahp_full_data" in wanted:
                analyses["cahp_full_data"] = analysis_for(dense, train, protocol, seed, signature_samples="all",
                                                          calibration_fraction=1.0)
            say(f"seed {seed}: analyses {sorted(analyses)} in {time.perf_counter() - t:.0f} s")
            cached = quality._read_json(cache / f"selection-seed{seed}.json")
            for degree in protocol.degrees:
                cahp = choose(analyses["default"], analyses["default"].knees[degree].k, "cahp", seed=seed)
                if cached is not None and sorted(map(tuple, cached["degrees"][str(degree)]["kept"]["cahp"])) != \
                        sorted(map(tuple, _heads(cahp.kept_mask))):
                    raise SystemExit(f"seed {seed}: the analysis here does not reproduce the quality study's "
                                     "CAHP selection; its cells would not be comparable")
            for s, degree, name in pending:
                if s != seed:
                    continue
                chosen = variant_heads(name, analyses, degree, seed)
                cell = quality.run_cell(dense, train, test, chosen["heads"], protocol, seed, device, "ce")
                key = f"seed={seed}/degree={degree}/variant={name}"
                cells = quality.store_cell(cells_path, key, {"seed": seed, "degree": degree, "variant": name,
                                                             "k": chosen["k"], "heads_kept": chosen["heads_kept"],
                                                             "kept": chosen["heads"], **cell})
                say(f"seed {seed} degree {degree} {name}: {chosen['heads_kept']} heads (k {chosen['k']}), accuracy "
                    f"{cell['accuracy']:.4f} (before recovery {cell['accuracy_before_recovery']:.4f}) in "
                    f"{cell['wall_s']:.0f} s")
    grid = quality._read_json(cache / protocol.cells_file()) or {}
    layers: dict[str, Any] = {}  # heads kept per layer, per seed, degree and method: the distribution itself
    for seed in protocol.seeds:
        selection = quality._read_json(cache / f"selection-seed{seed}.json") or {"degrees": {}}
        n_layers = int(selection.get("shape", [0])[0])
        for degree in protocol.degrees:
            info = selection["degrees"].get(str(degree))
            if info is None:
                continue
            found = {name: _per_layer(heads, n_layers) for name, heads in info["kept"].items()}
            found |= {c["variant"]: _per_layer(c["kept"], n_layers) for c in cells.values()
                      if c["seed"] == seed and c["degree"] == degree}
            layers[f"seed={seed}/degree={degree}"] = found
    return {"settings": {"seeds": list(protocol.seeds), "degrees": list(protocol.degrees), "variants": list(variants),
                         "recovery_epochs": protocol.recovery_epochs, "recovery_lr": protocol.recovery_lr},
            "dense": quality._read_json(cache / "dense.json"),
            "cells": [cells[k] for s, d, v in todo if (k := f"seed={s}/degree={d}/variant={v}") in cells],
            "heads_per_layer": layers,
            "reference_cells": [grid[k] for s in protocol.seeds for d in protocol.degrees for st in quality.STRATEGIES
                                if (k := quality._cell_key(s, d, st)) in grid]}


def markdown(doc: dict[str, Any]) -> str:
    """Per degree: each variant beside CAHP, salience top-k and random (cross-entropy), per seed and mean."""
    lines = ["# SST-5: what changes CAHP's accuracy after recovery (one cause at a time)", "",
             f"Date {doc['date']}; command `{doc['command']}`; dense test accuracy "
             f"{100 * doc['dense']['test']['accuracy']:.1f} %; recovery {doc['settings']['recovery_epochs']:g} "
             "epochs with cross-entropy; SST-5 test accuracy (%) after recovery, heads kept in brackets.", ""]
    seeds = doc["settings"]["seeds"]
    rows = {("ref", c["strategy"], c["seed"], c["degree"]): c for c in doc["reference_cells"]}
    rows |= {("var", c["variant"], c["seed"], c["degree"]): c for c in doc["cells"]}
    names = [("ref", s, quality.LABELS[s]) for s in quality.STRATEGIES] + \
            [("var", v, LABELS[v]) for v in doc["settings"]["variants"]]
    for degree in doc["settings"]["degrees"]:
        lines += [f"## Degree {degree}", "", "| Method | " + " | ".join(f"seed {s}" for s in seeds) + " | mean |",
                  "|---|" + "---|" * (len(seeds) + 1)]
        for kind, name, text in names:
            got = [rows.get((kind, name, s, degree)) for s in seeds]
            accs = [100 * c["accuracy"] for c in got if c is not None]
            cells = ["–" if c is None else f"{100 * c['accuracy']:.1f} ({c['heads_kept']})" for c in got]
            mean = f"{statistics.fmean(accs):.1f}" if len(accs) == len(seeds) else "–"
            lines.append(f"| {text} | " + " | ".join(cells) + f" | {mean} |")
        lines.append("")
        lines += [f"Heads kept per layer at degree {degree} (layer 0 first):", "",
                  "| Method | " + " | ".join(f"seed {s}" for s in seeds) + " |", "|---|" + "---|" * len(seeds)]
        for _kind, name, text in names:
            per = [doc.get("heads_per_layer", {}).get(f"seed={s}/degree={degree}", {}).get(name) for s in seeds]
            if any(p is not None for p in per):
                lines.append(f"| {text} | " + " | ".join("–" if p is None else " ".join(map(str, p)) for p in per)
                             + " |")
        lines.append("")
    return "\n".join(lines)


def _check(variants: tuple[str, ...]) -> None:
    if set(variants) - set(VARIANTS):
        raise SystemExit(f"--variants takes {', '.join(VARIANTS)}, got {','.join(variants)!r}")


def main(argv: list[str] | None = None) -> None:
    grid_study.main(argv, name="quality-causes", seeds="42,43,44", degrees="6", variants=VARIANTS, check=_check,
                    run=run, markdown=markdown,
                    protocol_text="one cause at a time against CAHP's defaults; quality benchmark cache and recovery")
