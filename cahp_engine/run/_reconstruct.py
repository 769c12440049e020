"""The reconstruction step of a run: calibration batches from the training rows, then
:func:`cahp_engine.recovery.reconstruct` on the pruned model, in its own stage.

A run reconstructs when ``config.recovery`` is ``reconstruct`` or ``reconstruct+finetune``; so does every
candidate of an accuracy budget, whatever the mode (its score right after reconstruction is what the
search judges first).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from cahp_engine.config import PruningConfig
from cahp_engine.data import TrainRows, draw_subset, iterate_batches, length_grouped_batches, take_rows
from cahp_engine.errors import InvalidInputError, UnsupportedModelError
from cahp_engine.models import get_adapter
from cahp_engine.progress import CancelFn
from cahp_engine.recovery import Reconstruction, ReconstructionOptions, reconstruct, unsupported_reason

#: Sentences per calibration batch: the batches only bound memory, the sums do not depend on them.
CALIBRATION_BATCH = 32


def reconstructs(config: PruningConfig) -> bool:
    """Whether a run with ``config`` reconstructs its pruned model."""
    return config.recovery in ("reconstruct", "reconstruct+finetune")


def finetunes(config: PruningConfig) -> bool:
    """Whether a run with ``config`` fine-tunes its pruned model (for ``config.epochs``)."""
    return config.recovery in ("finetune", "reconstruct+finetune")


def judges_budget(config: PruningConfig) -> bool:
    """Whether an accuracy budget with ``config`` scores its candidates after reconstruction (a judged search)."""
    return config.budget_search == "judged" or (config.budget_search == "auto" and reconstructs(config))


def check_reconstruction(model: nn.Module, config: PruningConfig, rows: TrainRows | None = None) -> None:
    """Refuse, before any work, a reconstructing mode that ``model``'s family cannot run (the reason said), or,
    under ``recovery`` reconstruct (the reconstruction is the model delivered), one whose calibration tokens
    from ``rows`` are fewer than a layer that keeps all its heads has unknowns. A run that fine-tunes
    afterwards goes on: its reconstruction leaves the systems short of tokens as pruned, and says so."""
    judged = config.max_accuracy_drop is not None and judges_budget(config)
    if not reconstructs(config) and not judged:
        return
    what = (f"`recovery` {config.recovery!r}" if reconstructs(config) else
            "`budget_search` 'judged' scores candidates after reconstruction, which")
    instead = "use `recovery` 'finetune'" if reconstructs(config) else "use `budget_search` 'halving'"
    reason = unsupported_reason(model, ReconstructionOptions())
    if reason is not None:
        raise UnsupportedModelError(f"{what} cannot run on this model: {reason}; {instead}")
    if rows is None or finetunes(config):
        return
    adapter = get_adapter(model)
    needed = adapter.num_heads(model.config) * adapter.head_dim(model.config) + 1
    drawn = _calibration_rows(rows, config)
    tokens = int(take_rows(rows, drawn).lengths.sum())
    if tokens < needed:
        raise InvalidInputError(
            f"{what} needs at least {needed} calibration tokens (the unknowns per output of a layer that keeps all "
            f"its heads), and the {len(drawn)} training rows it draws (`reconstruction_rows` "
            f"{config.reconstruction_rows}, at least one per class) hold {tokens}; give more or longer training rows, "
            f"or {instead}")


def calibration_batches(rows: TrainRows, config: PruningConfig,
                        device: torch.device | str = "cpu") -> list[dict[str, torch.Tensor]]:
    """``config.reconstruction_rows`` training rows drawn with the seed (stratified), in batches by length."""
    data = take_rows(rows, _calibration_rows(rows, config))
    batches = length_grouped_batches(data.lengths, np.arange(len(data)), CALIBRATION_BATCH)
    return list(iterate_batches(data, batches, device))


def _calibration_rows(rows: TrainRows, config: PruningConfig) -> np.ndarray:
    """The indices of the ``config.reconstruction_rows`` training rows a reconstruction draws (stratified)."""
    count = min(config.reconstruction_rows, len(rows))
    return draw_subset(len(rows), count, seed=config.seed, labels=np.asarray(rows.labels))


#: What a run refits, layer by layer: the attention output projection, then the feed-forward output
#: projection, each matching the dense model's sum with the residual it is added to (docs/method.md). With
#: heads removed and every neuron kept, the feed-forward refit still absorbs what the attention refit left
#: (docs/performance.md, "The feed-forward refit after the heads'").
RUN_RECONSTRUCTION = ReconstructionOptions(sublayers=("attention", "ffn"), ffn_target="residual")


def reconstruction_options(pruned: nn.Module, config: PruningConfig) -> ReconstructionOptions:
    """The run's options for reconstructing ``pruned``: :data:`RUN_RECONSTRUCTION`, or the
    attention refit alone when the family's feed-forward output projection cannot be refit (cahp cuts
    neurons only where it can, so that refit would only have refined blocks that lost nothing). When the
    run fine-tunes afterwards, a system with fewer calibration tokens than unknowns is left as pruned
    (``short`` skip, with a note) instead of failing the run."""
    options = RUN_RECONSTRUCTION if unsupported_reason(pruned, RUN_RECONSTRUCTION) is None else ReconstructionOptions()
    return dataclasses.replace(options, short="skip") if finetunes(config) else options


def reconstruct_pruned(dense: nn.Module, pruned: nn.Module, batches: Sequence[dict[str, torch.Tensor]],
                       config: PruningConfig, *, should_cancel: CancelFn | None = None) -> Reconstruction:
    """The run's reconstruction of ``pruned`` (in place) against ``dense``, with :func:`reconstruction_options`
    and the run's seed; the run's own stage, which reports its progress, calls
    :func:`cahp_engine.recovery.reconstruct` with the same."""
    return reconstruct(dense, pruned, batches, reconstruction_options(pruned, config), seed=config.seed,
                       should_cancel=should_cancel)
