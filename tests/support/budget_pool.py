"""What the budget-pool tests share: a budget job's settings, its inputs, and its pieces as rows."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text

from tests.support.helpers import write_split, write_tiny_model
from tests.support.stack import Stack

#: A budget job on the tiny model whose pieces last long enough to be seen running anywhere: fine-tuning
#: alone, so every candidate of the successive-halving search is a piece a worker can take.
BUDGET_PARAMS: dict[str, Any] = {
    "recovery": "finetune",
    "dense_finetune": "always", "dense_epochs": 4, "dense_lr": 2e-3, "lr": 5e-4, "batch_size": 2, "epochs": 48,
    "eval_steps": 75 * 24, "max_accuracy_drop": 3.0, "budget_screen_epochs": 24.0, "budget_parallel": 2,
    "resolution": 6, "signature_samples": "all", "calibration_fraction": 1.0, "stability_shards": 0,
    "latency_repeats": 1, "latency_warmup": 0, "seed": 5,
}


def budget_inputs(stack: Stack) -> tuple[str, str]:
    """The tiny model and dataset of a budget job, written once under the stack's local root."""
    root = stack.settings.allowed_local_roots[0] / "budget"
    if not (root / "model").exists():
        write_tiny_model(root / "model")
        for split, (n, seed) in {"train": (150, 0), "validation": (60, 2), "test": (45, 1)}.items():
            write_split(root / "data" / f"{split}.csv", n, seed=seed)
    return str(root / "model"), str(root / "data")


def budget_pieces(stack: Stack, job_id: str) -> list[dict[str, Any]]:
    """The budget job's pieces as rows, oldest first."""
    with stack.engine.connect() as connection:
        rows = connection.execute(text("SELECT id, candidate, piece, status, worker_id, attempts, updated_at "
                                       "FROM budget_pieces WHERE job_id = :id ORDER BY created_at, candidate"),
                                  {"id": job_id}).mappings().all()
    return [dict(row) for row in rows]
