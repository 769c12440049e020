"""The files a pruning run writes next to its report: the checkpoint, the MSS curve, the head map, and
the accuracy budget's candidates (``budget.png``) when the run had a budget.

Their fields are documented in ``docs/artifacts.md``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from cahp_engine.config import PruningConfig
from cahp_engine.data import EncodedDataset, collate
from cahp_engine.errors import PipelineError
from cahp_engine.models import current_kept_heads, get_adapter, load_pruned, neurons_per_layer, save_pruned
from cahp_engine.results import BudgetRecord
from cahp_engine.run._plots import (
    HeadMap,
    MssPlot,
    plot_budget,
    plot_head_map,
    plot_layer_retention,
    plot_layer_units,
    plot_mss_curve,
)
from cahp_engine.run._report import CheckpointRecord
from cahp_engine.run._steps import Inputs, RunContext
from cahp_engine.selection import SelectionResult

#: Files written next to ``model/``.
ARTIFACT_FILES: tuple[str, ...] = (
    "mss_curve.json",
    "mss_curve.png",
    "head_map.json",
    "head_map.png",
    "layer_retention.png",
    "report.json",
)
#: Written next to them when the run cut feed-forward neurons: heads and neurons kept per layer.
LAYER_UNITS = "layer_units.png"


def write_artifacts(run: RunContext, *, work: Path, pruned: nn.Module, inputs: Inputs,
                    result: SelectionResult) -> CheckpointRecord:
    """Save the pruned checkpoint (with ``inputs``' tokenizer) under ``work/model`` and check it reloads on the
    evaluation split; write the curve and the head map.

    ``report.json`` is written last, by the caller, once the run's wall time is known.
    """
    save_pruned(pruned, inputs.loaded.tokenizer, work / "model")
    diff = verify_checkpoint(pruned, work / "model", inputs.evaluation, run.device)
    write_curve(work, result, run.config)
    write_head_map(work, result)
    adapter, neurons = get_adapter(pruned), neurons_per_layer(pruned)
    if any(n != adapter.num_neurons(pruned.config) for n in neurons):
        # Feed-forward neurons were cut (a speed or FLOPs target): the map of both, beside the head map.
        plot_layer_units([len(h) for h in current_kept_heads(pruned)], neurons,
                         heads_total=adapter.num_heads(pruned.config), neurons_total=adapter.num_neurons(pruned.config),
                         path=work / LAYER_UNITS)
    return CheckpointRecord(path="model", format="safetensors", max_abs_logit_diff_after_reload=diff)


def verify_checkpoint(model: nn.Module, path: Path, data: EncodedDataset, device: torch.device) -> float:
    """Reload the saved checkpoint and compare its logits with the in-memory model's on a few samples."""
    # The run's own output, saved from a model already in memory: the size limit guarded the load.
    reloaded = load_pruned(path, device=device, max_params=sys.maxsize)
    batch = collate(data, np.arange(min(len(data), 8)))
    inputs = {k: v.to(device) for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        diff = float((model(**inputs).logits - reloaded(**inputs).logits).abs().max())
    if not diff <= 1e-4:
        raise PipelineError(f"the saved checkpoint does not reproduce the model (max logit difference {diff:g})")
    return diff


def write_curve(work: Path, result: SelectionResult, config: PruningConfig) -> None:
    """``mss_curve.json`` and ``mss_curve.png``."""
    curve, knees_of = result.analysis.curve, result.analysis.knees
    ks, mss = curve.ks.tolist(), curve.mss.tolist()
    knees = {str(d): k.k for d, k in sorted(knees_of.items())}
    write_json(work / "mss_curve.json", {
        "k": ks,
        "mss": mss,
        "polynomial_degree": config.poly_degree,
        "knee": result.k_star,
        "knee_found": result.knee.found if result.knee else None,
        "fixed_heads_to_keep": config.heads_to_keep,
        "knees_by_degree": knees,
        "knees_found_by_degree": {str(d): k.found for d, k in sorted(knees_of.items())},
        "seed": config.seed,
    })
    plot_mss_curve(MssPlot(ks, mss, {d: k.k for d, k in knees_of.items()}, int(result.k_star or 0),
                           chosen_degree=None if config.heads_to_keep else config.poly_degree), work / "mss_curve.png")


def write_head_map(work: Path, result: SelectionResult) -> None:
    """``head_map.json``, ``head_map.png`` and ``layer_retention.png``."""
    sel = result.selection
    stability = result.stability
    consensus = sel.consensus
    analysis = result.analysis
    shape = sel.kept_mask.shape
    cluster = (result.clustering.labels.reshape(shape) if result.clustering is not None
               else np.zeros(shape, dtype=np.int64))
    medoids = result.clustering.medoids.tolist() if result.clustering is not None else []
    write_json(work / "head_map.json", {
        "num_layers": shape[0],
        "num_heads": shape[1],
        "strategy": sel.strategy,
        "k_star": result.k_star,
        "kept": {str(layer): heads for layer, heads in sel.kept.items()},
        "salience": analysis.salience.tolist(),
        "salience_raw": analysis.salience_raw.tolist(),
        "cluster": cluster.tolist(),
        "medoids": [[m // shape[1], m % shape[1]] for m in medoids],
        "representatives": [list(h) for h in sel.representatives],
        "layer_safety_added": [list(h) for h in sel.layer_safety_added],
        "graph_space": analysis.graph_space.points.tolist(),
        "kept_frequency": None if stability is None else [list(row) for row in stability.kept_frequency],
        "consensus": None if consensus is None else consensus.to_dict(),
    })
    title = None if stability is None else (
        f"kept in {stability.shards} leave-one-shard-out runs\n(mean Jaccard {stability.mean_jaccard:.2f})")
    consensus_title = None if consensus is None else (
        f"{consensus.method}: kept by CAHP in {consensus.runs} runs\n(mean Jaccard {consensus.mean_jaccard:.2f})")
    plot_head_map(HeadMap(sel.kept_mask, analysis.salience, cluster, representatives=sel.representatives,
                          layer_safety_added=sel.layer_safety_added,
                          kept_frequency=None if stability is None else np.asarray(stability.kept_frequency),
                          stability_title=title,
                          consensus_frequency=None if consensus is None else np.asarray(consensus.kept_frequency),
                          consensus_title=consensus_title), work / "head_map.png")
    plot_layer_retention(sel.kept_mask, work / "layer_retention.png")


def write_budget_plot(work: Path, budget: BudgetRecord, total_heads: int) -> None:
    """``budget.png``: every candidate the accuracy budget tried, against its threshold."""
    plot_budget(budget, total_heads=total_heads, path=work / "budget.png")


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """``payload`` as indented JSON, keys in their given order."""
    path.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n")
