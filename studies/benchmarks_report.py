"""The benchmarks study's figures from its record alone: the tables per task, the selection's cost, the
per-layer retention figure, and the verdict of the decision rule fixed before the figures.

The rule (docs/performance.md, "The decision rule"), applied by :func:`verdict`:

1. Candidates: every measured strategy except ``random`` (the floor).
2. Score: mean test accuracy after recovery over (task, degree), each the mean over the seeds; the
   leader has the highest score (a tie within 0.0001 goes to the current default).
3. A candidate is within the leader's noise when the mean of the paired differences (leader minus
   candidate, same task, degree and seed) is at most twice their standard error.
4. Among those, one whose run-to-run agreement (mean Jaccard of sample-order pairs over the tasks and
   degrees) exceeds the leader's by at least 0.05 agrees clearly better; the one that agrees most wins.
5. The verdict changes the default only when every cell of every candidate and every agreement
   figure is measured; otherwise it is labelled partial and decides nothing.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from studies import common

DEFAULT = "cahp"  # the product's default now; a test keeps the docs and PruningConfig equal to it
FLOOR = "random"
TIE = 1e-4
NOISE_SE = 2.0
AGREEMENT_MARGIN = 0.05


def _read(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


def _mean_sd(values: list[float]) -> dict[str, Any]:
    return {"n": len(values), "mean": statistics.fmean(values) if values else None,
            "sd": statistics.stdev(values) if len(values) > 1 else None}


def agreement_of(doc: Any, task: str, degree: str, strategy: str) -> float | None:
    """Mean Jaccard of a strategy's kept heads over the sample-order pairs (the engine's default rules)."""
    try:
        return float(doc["tasks"][task]["off"]["summary"]["degrees"][degree]["methods"][strategy]["jaccard"]["mean"])
    except (KeyError, TypeError):
        return None


def collect(record: Path, tasks: list[str], strategies: tuple[str, ...], seeds: tuple[int, ...],
            degrees: tuple[int, ...], *, protocol: dict[str, Any], agreement_outputs: dict[str, str]) -> dict[str, Any]:
    """Everything the report needs, read from the record directory (and the agreement studies' results)."""
    cells: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    retention: dict[str, Any] = {}
    cost: dict[str, Any] = {}
    dense: dict[str, Any] = {}
    agreement: dict[str, Any] = {}
    for task in tasks:
        found = _read(record / task / "dense.json")
        if found is not None:
            dense[task] = {"accuracy": found["test"]["accuracy"], "macro_f1": found["test"]["macro_f1"],
                           "n": found["test"]["n"], "path": found.get("path"),
                           "training_s": found["training"]["wall_s"], "trained_on": found.get("trained_on")}
        selections = {s: sel for s in seeds if (sel := _read(record / task / f"selection-seed{s}.json"))}
        if selections:
            rows = list(selections.values())
            cost[task] = {"seeds": list(selections), "analysis_s": _mean_sd([r["analysis_s"] for r in rows]),
                          "peak_rss_above_start_mib": _mean_sd([r["peak_rss_above_start_mib"] for r in rows]),
                          "signature_rows": [r["signature_rows"] for r in rows],
                          "calibration_rows": [r["calibration_rows"] for r in rows],
                          "train_rows": rows[0]["train_rows"], "load_average": [r["load_average"] for r in rows],
                          "timings_s": {k: statistics.fmean(r["timings_s"].get(k, 0.0) for r in rows)
                                        for k in rows[0]["timings_s"]}}
        doc = _read(common.RESULTS / f"{agreement_outputs.get(task, '')}.json") if task != "sst5" else \
            _read(common.RESULTS / "agreement.json")
        for degree in map(str, degrees):
            for strategy in strategies:
                mine = [c for s in seeds
                        if (c := _read(record / task / "cells" / f"seed{s}-degree{degree}-{strategy}.json"))]
                cells += mine
                summary.setdefault(task, {}).setdefault(degree, {})[strategy] = {
                    "seeds": [c["seed"] for c in mine],
                    "heads_kept": _mean_sd([float(c["heads_kept"]) for c in mine]),
                    "before_accuracy": _mean_sd([c["before"]["accuracy"] for c in mine]),
                    "before_macro_f1": _mean_sd([c["before"]["macro_f1"] for c in mine]),
                    "accuracy": _mean_sd([c["after"]["accuracy"] for c in mine]),
                    "macro_f1": _mean_sd([c["after"]["macro_f1"] for c in mine]),
                    "wall_s": _mean_sd([c["wall_s"] for c in mine if "reused_from" not in c["recovery"]]),
                }
                kept = [sel["degrees"][degree]["kept"][strategy] for sel in selections.values()
                        if degree in sel["degrees"] and strategy in sel["degrees"][degree]["kept"]]
                if kept:
                    layers, width = selections[next(iter(selections))]["shape"]
                    shares = [[sum(1 for h in heads if h[0] == layer) / width for layer in range(layers)]
                              for heads in kept]
                    retention.setdefault(task, {}).setdefault(degree, {})[strategy] = {
                        "seeds": len(kept), "share": [statistics.fmean(col) for col in zip(*shares, strict=True)]}
                agreement.setdefault(task, {}).setdefault(degree, {})[strategy] = agreement_of(doc, task, degree,
                                                                                               strategy)
    wanted = len(tasks) * len(degrees) * len(strategies) * len(seeds)
    progress: dict[str, Any] = {}
    for task in tasks:
        mine = [c for c in cells if c["task"] == task]
        computed = [c["cpu_s"] for c in mine if "reused_from" not in c["recovery"] and "cpu_s" in c]
        left = len(degrees) * len(strategies) * len(seeds) - len(mine)
        per = statistics.fmean(computed) if computed else None
        progress[task] = {"done": len(mine), "left": left, "cpu_s_per_computed_cell": per,
                          "cpu_s_left": None if per is None else per * left}
    payload = {"settings": protocol, "dense": dense, "summary": summary, "retention": retention,
               "selection_cost": cost, "agreement": agreement, "cells_done": len(cells), "cells_wanted": wanted,
               "complete": len(cells) == wanted, "progress": progress, "cells": cells}
    payload["verdict"] = verdict(payload, tasks, strategies, seeds, degrees)
    return payload


def verdict(payload: dict[str, Any], tasks: list[str], strategies: tuple[str, ...], seeds: tuple[int, ...],
            degrees: tuple[int, ...]) -> dict[str, Any]:
    """The decision rule applied to what is recorded (``partial`` until every figure it reads exists)."""
    by_key = {(c["task"], c["degree"], c["strategy"], c["seed"]): c["after"]["accuracy"] for c in payload["cells"]}
    combos = [(t, d) for t in tasks for d in degrees]
    candidates = [s for s in strategies if s != FLOOR]
    scores: dict[str, float] = {}
    for s in candidates:
        means = [statistics.fmean(v) for t, d in combos
                 if (v := [by_key[(t, d, s, seed)] for seed in seeds if (t, d, s, seed) in by_key])]
        if len(means) == len(combos):
            scores[s] = statistics.fmean(means)
    agreement: dict[str, float | None] = {}
    for s in candidates:
        values = [payload["agreement"].get(t, {}).get(str(d), {}).get(s) for t, d in combos]
        agreement[s] = None if any(v is None for v in values) else statistics.fmean(v for v in values if v is not None)
    if not scores:
        return {"partial": True, "winner": None, "scores": {}, "agreement": agreement,
                "said": "no candidate has a cell at every task and degree yet: nothing to say"}
    best = max(scores.values())
    leaders = [s for s in scores if best - scores[s] <= TIE]
    leader = DEFAULT if DEFAULT in leaders else leaders[0]
    noise: dict[str, Any] = {}
    for s in scores:
        if s == leader:
            continue
        diffs = [by_key[(t, d, leader, seed)] - by_key[(t, d, s, seed)] for t, d in combos for seed in seeds
                 if (t, d, leader, seed) in by_key and (t, d, s, seed) in by_key]
        se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else None
        mean = statistics.fmean(diffs) if diffs else None
        noise[s] = {"pairs": len(diffs), "mean_difference": mean, "standard_error": se,
                    "within_noise": mean is not None and se is not None and mean <= NOISE_SE * se}
    winner, why = leader, f"{leader} has the highest mean accuracy after recovery ({100 * best:.2f})"
    lead_agreement = agreement.get(leader)
    better = [s for s, n in noise.items() if n["within_noise"] and lead_agreement is not None
              and agreement.get(s) is not None and agreement[s] - lead_agreement >= AGREEMENT_MARGIN]  # type: ignore[operator]
    if better:
        winner = max(better, key=lambda s: agreement[s] or 0.0)
        why = (f"{winner} is within the seeds' noise of {leader} and agrees run to run clearly better "
               f"({agreement[winner]:.2f} against {lead_agreement:.2f})")
    full = len(scores) == len(candidates) and all(
        (t, d, s, seed) in by_key for t, d in combos for s in candidates for seed in seeds) and all(
        v is not None for v in agreement.values())
    return {"partial": not full, "leader": leader, "winner": winner, "scores": scores, "noise": noise,
            "agreement": agreement, "said": why, "change_default": full and winner != DEFAULT}


# --------------------------------------------------------------------------- the tables and the figure


def _pct(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{100 * x:.{digits}f}"


def _ms(row: dict[str, Any]) -> str:
    if row["mean"] is None:
        return "–"
    return _pct(row["mean"]) + ("" if row["sd"] is None else f" ± {_pct(row['sd'])}") + f" (n={row['n']})"


def markdown(doc: dict[str, Any]) -> str:
    """The tables docs/performance.md takes its figures from (labelled partial while the record is)."""
    state = "complete" if doc["complete"] else f"**partial: {doc['cells_done']} of {doc['cells_wanted']} cells**"
    lines = [f"# The paper's two benchmarks across strategies ({state})", "",
             f"Date {doc['date']}; command `{doc['command']}`; the record: studies/results/benchmarks/.", "",
             "Protocol: " + json.dumps(doc["settings"]["recovery"]) + ".", ""]
    for task, degrees in doc["summary"].items():
        d = doc["dense"].get(task)
        lines += [f"## {task}" + ("" if d is None else f" (dense test accuracy {_pct(d['accuracy'])}, macro-F1 "
                                                        f"{_pct(d['macro_f1'])}, {d['n']} test rows)"), "",
                  "| degree | strategy | heads kept | accuracy before | macro-F1 before | accuracy after | "
                  "macro-F1 after | cell s |", "|---|---|---|---|---|---|---|---|"]
        for degree, rows in degrees.items():
            for strategy, r in rows.items():
                heads = "–" if r["heads_kept"]["mean"] is None else f"{r['heads_kept']['mean']:.1f}"
                wall = "–" if r["wall_s"]["mean"] is None else f"{r['wall_s']['mean']:.0f}"
                lines.append(f"| {degree} | {strategy} | {heads} | {_ms(r['before_accuracy'])} | "
                             f"{_ms(r['before_macro_f1'])} | {_ms(r['accuracy'])} | {_ms(r['macro_f1'])} | {wall} |")
        lines.append("")
    lines += ["## Per-layer retention (share of each layer's heads kept, mean over the seeds selected)", "",
              "| task | degree | strategy | seeds | layer 0 ... last |", "|---|---|---|---|---|"]
    for task, degrees in doc["retention"].items():
        for degree, rows in degrees.items():
            for strategy, r in rows.items():
                lines.append(f"| {task} | {degree} | {strategy} | {r['seeds']} | "
                             + " ".join(f"{v:.2f}" for v in r["share"]) + " |")
    lines += ["", "## The selection's cost (one analysis per seed, 1 thread)", "",
              "| task | train rows | seeds | analysis s | peak memory above start (MiB) | signature rows | "
              "calibration rows |", "|---|---|---|---|---|---|---|"]
    for task, c in doc["selection_cost"].items():
        lines.append(f"| {task} | {c['train_rows']} | {len(c['seeds'])} | {c['analysis_s']['mean']:.1f} | "
                     f"{c['peak_rss_above_start_mib']['mean']:.0f} | {c['signature_rows']} | {c['calibration_rows']} |")
    lines += ["", "## Run-to-run agreement (sample order, mean Jaccard over 5 pairs)", "",
              "| task | degree | " + " | ".join(next(iter(next(iter(doc["agreement"].values())).values()), {})) + " |",
              "|---|---|" + "---|" * len(next(iter(next(iter(doc["agreement"].values())).values()), {}))]
    for task, degrees in doc["agreement"].items():
        for degree, rows in degrees.items():
            lines.append(f"| {task} | {degree} | " + " | ".join("–" if v is None else f"{v:.2f}" for v in rows.values())
                         + " |")
    lines += ["", "## Progress (CPU seconds of one thread; reused cells cost only their scoring)", "",
              "| task | cells done | left | CPU s per computed cell | CPU hours left |", "|---|---|---|---|---|"]
    for task, g in doc.get("progress", {}).items():
        per = "–" if g["cpu_s_per_computed_cell"] is None else f"{g['cpu_s_per_computed_cell']:.0f}"
        left = "–" if g["cpu_s_left"] is None else f"{g['cpu_s_left'] / 3600:.1f}"
        lines.append(f"| {task} | {g['done']} | {g['left']} | {per} | {left} |")
    lines += _start_lines(doc.get("reconstructed_start") or [])
    v = doc["verdict"]
    lines += ["", "## The rule's verdict" + (" (partial: decides nothing)" if v["partial"] else ""), "",
              v["said"] + ".", ""]
    if v.get("scores"):
        lines += ["Scores (mean accuracy after recovery over task and degree): " + ", ".join(
            f"{s} {_pct(x)}" for s, x in sorted(v["scores"].items(), key=lambda i: -i[1])) + ".", ""]
    return "\n".join(lines)


def _start_lines(rows: list[dict[str, Any]]) -> list[str]:
    """``--start reconstructed``'s cells against the pruned start's (the same heads and recipe)."""
    if not rows:
        return []
    lines = ["", "## Recovery from the reconstructed model (`--start reconstructed`) against from the pruned weights",
             "", "Test accuracy; `by epoch` starts after the reconstruction (epoch 0).", "",
             "| task | seed | degree | strategy | heads | pruned | by epoch from reconstructed | from pruned, "
             "after | difference after | reconstruction s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        last = r["by_epoch"][-1][1]
        theirs = "–" if r["from_pruned"] is None else _pct(r["from_pruned"])
        gap = "–" if r["from_pruned"] is None else f"{100 * (last - r['from_pruned']):+.2f}"
        lines.append(f"| {r['task']} | {r['seed']} | {r['degree']} | {r['strategy']} | {r['heads_kept']} | "
                     f"{_pct(r['before'])} | " + ", ".join(_pct(a) for _, a in r["by_epoch"])
                     + f" | {theirs} | {gap} | {r['reconstruction_s']:.0f} |")
    return lines


def plot_retention(doc: dict[str, Any], path: Path) -> None:
    """One figure: per task and degree, the share of each layer's heads every strategy keeps."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = [(t, d) for t, degrees in doc["retention"].items() for d in degrees]
    fig = Figure(figsize=(4.2 * max(1, len(panels)), 3.6))
    FigureCanvasAgg(fig)
    for i, (task, degree) in enumerate(panels, 1):
        ax = fig.add_subplot(1, len(panels), i)
        for strategy, r in doc["retention"][task][degree].items():
            ax.plot(range(len(r["share"])), r["share"], marker="o", label=f"{strategy} ({r['seeds']})")
        ax.set_title(f"{task}, degree {degree}")
        ax.set_xlabel("layer")
        ax.set_ylim(0, 1.05)
        if i == 1:
            ax.set_ylabel("share of the layer's heads kept")
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
