"""A latency table seeded in the worker's cache, as an earlier job on this machine would have left it."""

from __future__ import annotations

from pathlib import Path

from app.core.settings import Settings
from cahp_engine.allocation import CostModel
from cahp_engine.allocation._costs import _cache_key, _write_cache
from cahp_engine.models import load_classifier
from worker.claims import latency_cache_dir


def seed_latency_table(settings: Settings, model_dir: Path, *, batch_size: int, seq_len: int) -> CostModel:
    """Write a PyTorch latency table for the model in ``model_dir`` at ``batch_size`` x ``seq_len`` into the
    worker's cache and return it. Its figures are none a timing of a tiny model gives (which are overhead
    and noise, a different reachable speed-up each time): a job reads this table, whatever the machine's
    load, and its report shows that it did."""
    model = load_classifier(str(model_dir), num_labels=3).model
    config = model.config
    table = CostModel(unit="seconds", fixed=0.002, attention=0.001, head=0.0005, ffn=0.001, neuron=0.00002,
                      num_layers=config.num_hidden_layers, num_heads=config.num_attention_heads,
                      num_neurons=config.intermediate_size, batch_size=batch_size, seq_len=seq_len,
                      runtime="pytorch", points=8, fit_error=0.0321)
    key = _cache_key(model, batch_size=batch_size, seq_len=seq_len, runtime="pytorch")
    _write_cache(latency_cache_dir(settings), key, table)
    return table
