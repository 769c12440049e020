"""Which distillation recovers CAHP's heads best: alpha and T, and hidden states.

Runs on the quality study's cache (the same dense all-MiniLM-L6-v2, CAHP's kept heads of each seed
and degree, the same teacher logits, recovery recipe and test split), so every figure sits beside the
grid's CAHP cells with cross-entropy and with the default distillation (alpha 0.5, T 4) of the same
seed and degree. The heads are the grid's CAHP selection (the engine's registered ``cahp`` strategy,
read from the cache); no selection is made here. A variant changes the recovery loss only:

- ``distill_a<alpha>_t<T>`` (e.g. ``distill_a0.9_t4``): logit distillation, loss = alpha CE + (1 - alpha)
  T² KL(teacher_T || student_T), with another alpha or temperature than the default's.
- ``hidden_b<beta>`` (e.g. ``hidden_b1``): the default logit distillation plus beta times the mean over
  the encoder's layers of the masked mean squared difference between the student's and the dense
  model's hidden states (a pruned layer keeps its width, so they compare directly; TinyBERT's
  hidden-state term). The dense model stays in memory and runs one extra forward pass per batch.

Finished cells go to ``distill-study-<recovery>.json`` in the cache at once (resumable).

Run: ``python -m studies distill-study [--seeds 42,43] [--degrees 2] [--variants ...] [--report-only]``
"""

from __future__ import annotations

import re
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cahp_engine._torch import model_inputs, resolve_device
from cahp_engine.recovery import AuxiliaryLoss
from studies import grid_study, quality

VARIANTS = ("distill_a0.9_t4", "distill_a0.5_t2", "distill_a0.5_t8", "hidden_b1")
_LOGITS = re.compile(r"^distill_a(?P<alpha>[0-9.]+)_t(?P<t>[0-9.]+)$")
_HIDDEN = re.compile(r"^hidden_b(?P<beta>[0-9.]+)$")


def parse_variant(name: str) -> dict[str, float]:
    """``{"alpha", "temperature"}`` of a logit variant, or ``{"beta"}`` of a hidden-state one."""
    if (m := _LOGITS.match(name)) is not None:
        alpha, temperature = float(m["alpha"]), float(m["t"])
        if not (0.0 <= alpha <= 1.0 and temperature > 0.0):
            raise ValueError(f"{name!r}: alpha must be in [0, 1] and T > 0")
        return {"alpha": alpha, "temperature": temperature}
    if (m := _HIDDEN.match(name)) is not None:
        return {"beta": float(m["beta"])}
    raise ValueError(f"unknown variant {name!r}: use distill_a<alpha>_t<T> or hidden_b<beta>, "
                     f"for example {', '.join(VARIANTS)}")


def label(name: str) -> str:
    got = parse_variant(name)
    if "beta" in got:
        return f"Distillation (alpha 0.5, T 4) + hidden states x {got['beta']:g}"
    return f"Distillation, alpha {got['alpha']:g}, T {got['temperature']:g}"


def hidden_state_loss(teacher: nn.Module, beta: float) -> AuxiliaryLoss:
    """``beta`` times the mean over layers of the masked mean squared hidden-state difference.

    Parameters
    ----------
    teacher : the dense model, in eval mode; run without gradients on each batch.
    beta : float
        Weight of the term against the logit loss.
    """

    def loss(outputs: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.no_grad():
            target = teacher(**model_inputs(teacher, batch), output_hidden_states=True).hidden_states
        mask = batch["attention_mask"].unsqueeze(-1).float()
        denominator = mask.sum() * outputs.hidden_states[0].shape[-1]
        # Layer outputs only (index 0 is the embeddings, which pruning leaves alone).
        per_layer = [(((student.float() - dense.float()) ** 2) * mask).sum() / denominator
                     for student, dense in zip(outputs.hidden_states[1:], target[1:], strict=True)]
        return beta * torch.stack(per_layer).mean()

    return loss


def _key(seed: int, degree: int, variant: str) -> str:
    return f"seed={seed}/degree={degree}/variant={variant}"


def run(protocol: quality.Protocol, variants: tuple[str, ...], *, base: str, cache: Path, data_dir: Path,
        compute: bool, say: Any) -> dict[str, Any]:
    """Recover CAHP's heads with every (seed, degree, variant) not yet in the cache; return the cells with
    the grid's CAHP cells (cross-entropy and the default distillation) of the same seeds and degrees."""
    for name in variants:
        parse_variant(name)
    cells_path = cache / f"distill-study-{protocol.cells_file()}"
    cells: dict[str, Any] = quality._read_json(cells_path) or {}
    todo = [(s, d, v) for s in protocol.seeds for d in protocol.degrees for v in variants]
    pending = [t for t in todo if _key(*t) not in cells]
    if compute and pending:
        device = resolve_device("cpu")
        dense, tokenizer, _record = quality.dense_model(base, data_dir, cache, protocol, device, say)
        train, test = quality.load_data(data_dir, tokenizer, protocol)
        teacher = quality.teacher_for(dense, train, cache, protocol, device, say)
        for seed, degree, name in pending:
            selection = quality._read_json(cache / f"selection-seed{seed}.json")
            if selection is None or str(degree) not in selection["degrees"]:
                raise SystemExit(f"seed {seed}, degree {degree}: no CAHP selection in {cache}; run "
                                 f"`python -m studies quality --seeds {seed} --degrees {degree}` first")
            heads = selection["degrees"][str(degree)]["kept"]["cahp"]
            got = parse_variant(name)
            if "beta" in got:
                cell = quality.run_cell(dense, train, test, heads, protocol, seed, device, "distill", teacher,
                                        auxiliary_loss=hidden_state_loss(dense, got["beta"]))
            else:
                settings = replace(protocol, distill_alpha=got["alpha"], distill_temperature=got["temperature"])
                cell = quality.run_cell(dense, train, test, heads, settings, seed, device, "distill", teacher)
            cells = quality.store_cell(cells_path, _key(seed, degree, name),
                                       {"seed": seed, "degree": degree, "variant": name, **got,
                                        "heads_kept": len(heads), **cell})
            say(f"seed {seed} degree {degree} {name}: {len(heads)} heads, accuracy {cell['accuracy']:.4f} "
                f"in {cell['wall_s']:.0f} s")
    grid = quality._read_json(cache / protocol.cells_file()) or {}
    return {"settings": {"seeds": list(protocol.seeds), "degrees": list(protocol.degrees), "variants": list(variants),
                         "recovery_epochs": protocol.recovery_epochs, "recovery_lr": protocol.recovery_lr},
            "dense": quality._read_json(cache / "dense.json"),
            "cells": [cells[k] for t in todo if (k := _key(*t)) in cells],
            "reference_cells": [grid[k] for s in protocol.seeds for d in protocol.degrees for loss in ("ce", "distill")
                                if (k := quality._cell_key(s, d, "cahp", loss)) in grid]}


def markdown(doc: dict[str, Any]) -> str:
    """Per degree: each variant beside CAHP's cross-entropy and default-distillation cells, per seed and mean."""
    seeds = doc["settings"]["seeds"]
    lines = ["# SST-5: which distillation recovers CAHP's heads best", "",
             f"Date {doc['date']}; command `{doc['command']}`; dense test accuracy "
             f"{100 * doc['dense']['test']['accuracy']:.1f} %; recovery {doc['settings']['recovery_epochs']:g} "
             "epochs; SST-5 test accuracy (%) after recovery, CAHP's heads (count in brackets).", ""]
    rows = {(c.get("loss", "ce") if "strategy" in c else c["variant"], c["seed"], c["degree"]): c
            for c in [*doc["reference_cells"], *doc["cells"]]}
    names = [("ce", "Cross-entropy (the paper's)"), ("distill", "Distillation, alpha 0.5, T 4 (the default)")]
    names += [(v, label(v)) for v in doc["settings"]["variants"]]
    for degree in doc["settings"]["degrees"]:
        lines += [f"## Degree {degree}", "", "| Recovery loss | " + " | ".join(f"seed {s}" for s in seeds)
                  + " | mean |", "|---|" + "---|" * (len(seeds) + 1)]
        for key, text in names:
            got = [rows.get((key, s, degree)) for s in seeds]
            accs = [100 * c["accuracy"] for c in got if c is not None]
            shown = ["–" if c is None else f"{100 * c['accuracy']:.1f} ({c['heads_kept']})" for c in got]
            mean = f"{statistics.fmean(accs):.1f}" if len(accs) == len(seeds) else "–"
            lines.append(f"| {text} | " + " | ".join(shown) + f" | {mean} |")
        lines.append("")
    return "\n".join(lines)


def _check(variants: tuple[str, ...]) -> None:
    try:
        for name in variants:
            parse_variant(name)
    except ValueError as exc:
        raise SystemExit(f"--variants: {exc}") from None


def main(argv: list[str] | None = None) -> None:
    grid_study.main(argv, name="distill-study", seeds="42,43", degrees="2", variants=VARIANTS, check=_check,
                    run=run, markdown=markdown,
                    protocol_text="CAHP's heads of the quality benchmark, recovered with other distillation losses")
